"""The reference side's graph, loaded by LangGraph's server in its own venv (never
imported by runwire's tests): a `MessagesState` whose one node, `chat`, streams the
scripted tokens of `reply` (one every `delay_ms`) as one AI message, asks `ask` through
`interrupt()` when given and appends " you said <answer>", or raises `fail`."""

import asyncio
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt


class ScriptedModel(BaseChatModel):
    """A chat model that answers its tokens, streamed when asked to stream."""

    tokens: list[str]
    delay_ms: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **_: Any
    ) -> ChatResult:
        return ChatResult(
            generations=[ChatGeneration(message=AIMessage(content="".join(self.tokens)))]
        )

    async def _agenerate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **_: Any
    ) -> ChatResult:
        await asyncio.sleep(len(self.tokens) * self.delay_ms / 1000)
        return self._generate(messages)

    async def _astream(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **_: Any
    ) -> Any:
        for token in self.tokens:
            if self.delay_ms:
                await asyncio.sleep(self.delay_ms / 1000)
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=token))
            if run_manager:
                await run_manager.on_llm_new_token(token, chunk=chunk)
            yield chunk


class State(MessagesState):
    reply: list[str]
    delay_ms: int
    ask: Any
    fail: str


async def chat(state: State) -> dict[str, Any]:
    model = ScriptedModel(tokens=state.get("reply") or [], delay_ms=state.get("delay_ms") or 0)
    answer = await model.ainvoke(state["messages"])
    if state.get("fail"):
        raise ValueError(state["fail"])
    if state.get("ask") is not None:
        said = interrupt(state["ask"])
        answer = AIMessage(content=f"{answer.content} you said {said}", id=answer.id)
    return {"messages": [answer]}


builder = StateGraph(State)
builder.add_node("chat", chat)
builder.add_edge(START, "chat")
builder.add_edge("chat", END)
graph = builder.compile()
