// A chat page as LangGraph front ends are built: the SDK's `useStream` React hook, nothing
// of runwire's own. tests/integration/test_use_stream.py bundles it with esbuild and drives
// it in headless Chromium against LangGraph's own server and against the gateway.
//
// The query string says where to: ?api=<URL>&key=<API key>&assistant=<graph or runner>.
// The thread's id is kept in the tab's session storage, and `reconnectOnMount` keeps the
// running run's id there: a reload rejoins the stream where the run is. With &reconnect=0
// it does not (the hook's default): the run stops when the page goes.
import { useState } from "react";
import { createRoot } from "react-dom/client";
import { useStream } from "@langchain/langgraph-sdk/react";

const query = new URLSearchParams(window.location.search);
const THREAD = "chat:thread";

function text(content) {
  if (typeof content === "string") return content;
  return content.map((part) => (part.type === "text" ? part.text : "")).join("");
}

function Chat() {
  const [threadId, setThreadId] = useState(() => sessionStorage.getItem(THREAD));
  const [said, setSaid] = useState([]);
  const stream = useStream({
    apiUrl: query.get("api"),
    apiKey: query.get("key") || undefined,
    assistantId: query.get("assistant") || "chat",
    threadId,
    onThreadId: (id) => {
      sessionStorage.setItem(THREAD, id);
      setThreadId(id);
    },
    reconnectOnMount: query.get("reconnect") !== "0",
    onError: (error) => setSaid((now) => [...now, `error: ${error?.message ?? error}`]),
  });

  const send = (event) => {
    event.preventDefault();
    const form = new FormData(event.currentTarget);
    const input = { messages: [{ type: "human", content: form.get("message") }] };
    const reply = String(form.get("reply") || "");
    if (reply) input.reply = reply.split("|");
    if (form.get("delay")) input.delay_ms = Number(form.get("delay"));
    if (form.get("ask")) input.ask = form.get("ask");
    stream.submit(input);
  };

  const answer = (event) => {
    event.preventDefault();
    const form = new FormData(event.currentTarget);
    stream.submit(undefined, { command: { resume: form.get("answer") } });
  };

  const interrupt = stream.interrupt;
  return (
    <main>
      <ol id="messages">
        {stream.messages.map((message, index) => (
          <li key={message.id ?? index} data-type={message.type}>
            {text(message.content)}
          </li>
        ))}
      </ol>
      <p id="status">{stream.isLoading ? "streaming" : "idle"}</p>
      {interrupt && !stream.isLoading ? (
        <form id="interrupt" onSubmit={answer}>
          <label htmlFor="answer" id="question">
            {String(interrupt.value)}
          </label>
          <input id="answer" name="answer" />
          <button id="resume">Answer</button>
        </form>
      ) : null}
      <ul id="errors">
        {said.map((line, index) => (
          <li key={index}>{line}</li>
        ))}
      </ul>
      <form id="compose" onSubmit={send}>
        <input id="message" name="message" placeholder="Message" />
        <input id="reply" name="reply" placeholder="the reply's tokens, split by |" />
        <input id="delay" name="delay" placeholder="ms between tokens" />
        <input id="ask" name="ask" placeholder="a question to ask back" />
        <button id="send">Send</button>
      </form>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<Chat />);
