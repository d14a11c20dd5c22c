"""Where the client finds the stack: a settings file named with `--env` wins over the
shell's variables, which win over the nearest `.runwire/env`; and a client that finds
no stack says where it looked."""

import asyncio
import os
from pathlib import Path

import pytest

from runwire.client import Client, ClientError
from runwire.client.cli import main
from runwire.client.settings import DEFAULT_NATS_URL, ENV_FILE_VARIABLE, load_settings
from runwire.contracts.errors import ErrorCode
from runwire.infra.processes import port_is_free

pytestmark = pytest.mark.unit


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A shell in an empty folder, without any RUNWIRE_* variable."""
    for name in [n for n in os.environ if n.startswith("RUNWIRE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_a_settings_file_named_with_env_wins_over_the_shells_variables(
    shell: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # As after `set -a; . .runwire/env; set +a`: the default tenant's identity.
    shell.setenv("RUNWIRE_NATS_USER", "tenant-default")
    shell.setenv("RUNWIRE_NATS_PASSWORD", "the-tenants")
    shell.setenv("RUNWIRE_PREFIX", "rw")
    operator = tmp_path / "operator.env"
    operator.write_text("RUNWIRE_NATS_USER=operator\nRUNWIRE_NATS_PASSWORD=the-operators\n")
    shell.setenv(ENV_FILE_VARIABLE, str(operator))

    settings = load_settings()

    assert settings.nats_user == "operator"
    assert settings.nats_password is not None
    assert settings.nats_password.get_secret_value() == "the-operators"
    assert settings.prefix == "rw"  # what the file leaves out, the shell still gives


def test_the_shells_variables_win_over_the_nearest_env_file(
    shell: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".runwire").mkdir()
    (tmp_path / ".runwire" / "env").write_text("RUNWIRE_TENANT=default\nRUNWIRE_PREFIX=rw\n")
    shell.setenv("RUNWIRE_TENANT", "acme")

    settings = load_settings()

    assert (settings.tenant, settings.prefix) == ("acme", "rw")


def test_a_client_that_finds_no_stack_says_where_it_looked(
    shell: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not port_is_free(int(DEFAULT_NATS_URL.rsplit(":", 1)[1])):
        pytest.skip(f"a server listens at {DEFAULT_NATS_URL}, the default this test needs free")
    looked = (
        f"the default URL: RUNWIRE_NATS_URL is not in the environment, and there is no "
        f".runwire/env in {tmp_path} or a folder above it"
    )

    with pytest.raises(ClientError) as unreachable:
        asyncio.run(Client.connect(connect_timeout=0.5))
    with pytest.raises(SystemExit) as cli:
        main(["get", "some-run"])

    assert unreachable.value.code == ErrorCode.UNAVAILABLE
    assert f"cannot reach NATS at {DEFAULT_NATS_URL} ({looked}; " in unreachable.value.message
    assert cli.value.code == 1
    assert looked in capsys.readouterr().err
