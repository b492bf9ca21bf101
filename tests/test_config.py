"""runtime.config: the declared settings, env parsing, configure/configured, to_env, docs."""

import re
import warnings
from pathlib import Path

import pytest

import runtime
from runtime.config import (ALIASES, SETTINGS, TOKEN_ENV, UNMAPPED, Config, config,
                            configure, configured, markdown, parse_seconds)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def clean():
    """The global config with nothing set from Python; what was set before comes back."""
    saved = runtime.config.get_runtime_config()  # ignored Monarch names too
    runtime.config.clear_runtime_config()
    yield config
    runtime.config.clear_runtime_config()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        configure(**saved)


def test_docs_table_is_the_generated_one():
    text = (ROOT / "docs" / "configuration.md").read_text()
    m = re.search(r"<!-- BEGIN generated[^\n]*-->\n(.*?)<!-- END generated -->", text, re.S)
    assert m, "docs/configuration.md lost its generated block"
    assert m.group(1) == markdown(), "run: python -m runtime.config --markdown"


def test_every_setting_is_declared_with_env_type_default_doc():
    for s in SETTINGS.values():
        assert s.env.startswith("MONARCH_") and s.type in ("bool", "int", "float", "str", "path")
        assert s.doc and "\n" not in s.doc
        assert s.parse(None) == s.default
        assert s.parse(s.to_text(s.default)) == s.default
    assert len({s.env for s in SETTINGS.values()}) == len(SETTINGS)
    assert TOKEN_ENV not in {s.env for s in SETTINGS.values()}


def _documented_not_settings() -> set[str]:
    """The variables docs/configuration.md's "Not settings" section names."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("\n## Not settings\n", 1)
    assert len(section) == 2, "docs/configuration.md lost its 'Not settings' section"
    return set(re.findall(r"`\$?(MONARCH_[A-Z_]*[A-Z])`", section[1]))


def test_every_monarch_variable_in_the_code_is_declared_or_documented_as_not_a_setting():
    declared = {s.env for s in SETTINGS.values()}
    not_settings = _documented_not_settings()
    found = set()
    for pkg in ("runtime", "monarch_kernel", "monarch_widgets"):
        for f in (ROOT / pkg).rglob("*.py"):
            found |= set(re.findall(r"\bMONARCH_[A-Z_]*[A-Z]", f.read_text()))
    assert found - declared - not_settings == set(), "add them to docs/configuration.md"
    assert TOKEN_ENV in not_settings and not declared & not_settings


def test_the_test_suite_and_scripts_variables_are_documented_as_not_settings():
    declared = {s.env for s in SETTINGS.values()}
    found = set()
    for d in ("tests", "scripts"):
        for f in (ROOT / d).rglob("*"):
            if f.suffix in (".py", ".sh"):  # as an environment variable: quoted, $X, X=
                found |= set(re.findall(r"(?:[\"'$]|\$\{)(MONARCH_[A-Z_]*[A-Z])\b|"
                                        r"\b(MONARCH_[A-Z_]*[A-Z])=", f.read_text()))
    found = {a or b for a, b in found}
    assert found - declared - _documented_not_settings() == set()


def test_bad_env_values_name_the_variable():
    with pytest.raises(ValueError, match=re.escape("MONARCH_HEARTBEAT_TIMEOUT='abc': expected a number")):
        Config({"MONARCH_HEARTBEAT_TIMEOUT": "abc"})
    with pytest.raises(ValueError, match=re.escape("MONARCH_INTERRUPT_REMOTE='maybe': expected one of "
                                                   "0/1/true/false/yes/no")):
        Config({"MONARCH_INTERRUPT_REMOTE": "maybe"})
    with pytest.raises(ValueError, match=re.escape("MONARCH_MAX_MESSAGE_BYTES='1.5': expected an integer")):
        Config({"MONARCH_MAX_MESSAGE_BYTES": "1.5"})
    with pytest.raises(ValueError, match="MONARCH_HEARTBEAT_INTERVAL='0': expected a number > 0"):
        Config({"MONARCH_HEARTBEAT_INTERVAL": "0"})
    with pytest.raises(ValueError, match="MONARCH_DEBUG_POLICY='ignore': expected one of fail, continue"):
        Config({"MONARCH_DEBUG_POLICY": "ignore"})
    with pytest.raises(ValueError) as e:  # every bad variable is named at once
        Config({"MONARCH_RDMA_STREAMS": "0", "MONARCH_STOP_TIMEOUT": "soon"})
    assert "MONARCH_RDMA_STREAMS='0'" in str(e.value) and "MONARCH_STOP_TIMEOUT='soon'" in str(e.value)


def test_env_values_parse():
    c = Config({"MONARCH_HEARTBEAT_TIMEOUT": " 12.5 ", "MONARCH_INTERRUPT_REMOTE": "No",
                "MONARCH_MAX_MESSAGE_BYTES": "2e9", "MONARCH_STOP_TIMEOUT": "1m30s",
                "MONARCH_DEBUG_STDIN": "yes", "MONARCH_ADMIN": "0", "MONARCH_RDMA_TRANSPORT": "TCP",
                "MONARCH_KEY_FILE": "/k/cluster.key", "MONARCH_HEARTBEAT_INTERVAL": "",
                "MONARCH_DEBUG_TIMEOUT": "250ms"})
    assert c.heartbeat_timeout == 12.5 and c.interrupt_remote is False
    assert c.max_message_bytes == 2_000_000_000 and c.stop_timeout == 90.0
    assert c.debug_stdin is True and c.admin is False and c.rdma_transport == "tcp"
    assert c.key_file == "/k/cluster.key" and c.heartbeat_interval == 0.5  # blank: default
    assert c.debug_timeout == 0.25
    for text in ("1", "true", "YES"):
        assert Config({"MONARCH_HUGEPAGES": text}).hugepages is True
    assert parse_seconds("1h 30m") == 5400.0 and parse_seconds("500ms") == 0.5
    with pytest.raises(ValueError):
        parse_seconds("5 parsecs")


def test_live_settings_follow_the_environment_import_ones_wait_for_reload():
    env = {}
    c = Config(env)
    env["MONARCH_RDMA_TRANSPORT"] = "vm"
    env["MONARCH_HEARTBEAT_TIMEOUT"] = "9"
    assert c.rdma_transport == "vm" and c.heartbeat_timeout == 5.0
    c.reload()
    assert c.heartbeat_timeout == 9.0
    env["MONARCH_RDMA_TRANSPORT"] = "carrier-pigeon"  # bad after import: raised at the read
    with pytest.raises(ValueError, match="MONARCH_RDMA_TRANSPORT='carrier-pigeon'"):
        c.rdma_transport


def test_python_values_win_over_the_environment_until_reset():
    env = {"MONARCH_DEBUG_POLICY": "continue", "MONARCH_HEARTBEAT_TIMEOUT": "9"}
    c = Config(env)
    c.debug_policy, c.heartbeat_timeout = "fail", 2
    assert c.debug_policy == "fail" and c.heartbeat_timeout == 2.0
    assert c.explicit() == {"debug_policy": "fail", "heartbeat_timeout": 2.0}
    c.reload()  # explicit values survive a reload
    assert c.heartbeat_timeout == 2.0
    c.reset("debug_policy")
    assert c.debug_policy == "continue" and c.heartbeat_timeout == 2.0
    c.reset()
    assert c.heartbeat_timeout == 9.0 and c.explicit() == {}


def test_configure_sets_and_checks(clean):
    configure(heartbeat_timeout=7, rdma_streams=8, debug_policy="Continue", stop_timeout="2s")
    assert config.heartbeat_timeout == 7.0 and isinstance(config.heartbeat_timeout, float)
    assert config.rdma_streams == 8 and config.debug_policy == "continue"
    assert config.stop_timeout == 2.0
    with pytest.raises(TypeError, match=r"configure\(heartbeat_timeout=...\): setting "
                                        "'heartbeat_timeout' takes a number of seconds"):
        configure(heartbeat_timeout=[1])
    with pytest.raises(ValueError, match="heartbeat_timeout='abc': expected a number"):
        configure(heartbeat_timeout="abc")
    with pytest.raises(TypeError, match="setting 'interrupt_remote' takes bool, got int"):
        configure(interrupt_remote=1)
    with pytest.raises(TypeError, match="setting 'rdma_streams' takes int, got bool"):
        configure(rdma_streams=True)
    with pytest.raises(ValueError, match="rdma_transport='pigeon': expected one of auto, vm"):
        configure(rdma_transport="pigeon")
    with pytest.raises(ValueError, match="heartbeat_interval=0.0: expected a number > 0"):
        configure(heartbeat_interval=0)
    with pytest.raises(TypeError, match="unknown setting 'heartbeat_timout'; did you mean "
                                        "'heartbeat_timeout'"):
        configure(heartbeat_timout=3)
    with pytest.raises(TypeError):  # nothing of a rejected call is applied
        configure(rdma_streams=2, bogus=1)
    assert config.rdma_streams == 8
    with pytest.raises(AttributeError, match="did you mean 'stop_timeout'"):
        config.stop_timout = 3


def test_configured_restores_previous_values(clean):
    configure(stop_timeout=3.0)
    before = config.heartbeat_timeout
    with configured(stop_timeout=1, heartbeat_timeout=0.25, key_file=Path("/k")) as values:
        assert values["stop_timeout"] == 1.0 and config.heartbeat_timeout == 0.25
        assert config.key_file == "/k"
    assert config.stop_timeout == 3.0 and config.heartbeat_timeout == before
    assert config.explicit() == {"stop_timeout": 3.0}
    with pytest.raises(RuntimeError):
        with configured(debug_timeout=1):
            raise RuntimeError("boom")
    assert "debug_timeout" not in config.explicit()


def test_monarch_names(clean):
    assert ALIASES == {"codec_max_frame_length": "max_message_bytes",
                               "tail_log_lines": "stderr_tail_lines",
                               "stop_actor_timeout": "stop_timeout",
                               "enable_file_capture": "file_capture"}
    with configured(codec_max_frame_length=1 << 20, stop_actor_timeout="10s", tail_log_lines=5):
        assert config.max_message_bytes == 1 << 20 and config.stop_timeout == 10.0
        assert config.stderr_tail_lines == 5
    assert config.file_capture is None  # unset: on for jobs' agents, off for this_host()
    with configured(enable_file_capture=True):
        assert config.file_capture is True and config.to_env()["MONARCH_FILE_CAPTURE"] == "1"
    assert config.file_capture is None and "MONARCH_FILE_CAPTURE" not in config.to_env()
    with pytest.warns(UserWarning, match="'enable_log_forwarding' has no equivalent"):
        configure(enable_log_forwarding=True)
    assert config.explicit() == {} and "enable_log_forwarding" in UNMAPPED
    with pytest.raises(TypeError, match="both set 'stop_timeout'"):
        configure(stop_timeout=1, stop_actor_timeout="1s")


def test_every_monarch_configure_name_is_accepted(clean):
    """Monarch's configure() keywords (its 3fc0a66e config.pyi) are each an alias or an
    ignored name with a warning; none raises, none changes a setting."""
    monarch = ["default_transport", "enable_log_forwarding", "enable_file_capture",
               "tail_log_lines", "codec_max_frame_length", "message_delivery_timeout",
               "host_spawn_ready_timeout", "mesh_proc_spawn_max_idle", "process_exit_timeout",
               "message_ack_time_interval", "message_ack_every_n_messages",
               "message_ttl_default", "split_max_buffer_size", "split_max_buffer_age",
               "stop_actor_timeout", "cleanup_timeout", "default_encoding",
               "channel_net_rx_buffer_full_check_interval", "message_latency_sampling_rate",
               "enable_dest_actor_reordering_buffer", "mesh_bootstrap_enable_pdeathsig",
               "mesh_terminate_concurrency", "mesh_terminate_timeout", "small_write_threshold",
               "max_cast_dimension_size", "remote_alloc_bind_to_inaddr_any",
               "remote_alloc_bootstrap_addr", "remote_alloc_allowed_port_range",
               "read_log_buffer", "force_file_log", "prefix_with_rank", "actor_spawn_max_idle",
               "get_actor_state_max_idle", "supervision_watchdog_timeout", "proc_stop_max_idle",
               "get_proc_state_max_idle", "mesh_admin_addr", "mesh_attach_config_timeout",
               "mesh_orphan_timeout", "rdma_allow_tcp_fallback", "rdma_disable_ibverbs",
               "rdma_max_chunk_size_mb", "rdma_ibverbs_target", "rdma_peer_device_affinity",
               "rdma_runtime_worker_threads"]
    assert not [n for n in monarch if n not in ALIASES and n not in UNMAPPED]
    before = config.as_dict()
    for name in ("mesh_attach_config_timeout", "mesh_orphan_timeout"):
        with pytest.warns(UserWarning, match=f"'{name}' has no equivalent here and is ignored"):
            with configured(**{name: "10s"}) as values:
                assert values == before
    with pytest.warns(UserWarning, match="rdma_disable_ibverbs.*use rdma_transport"):
        configure(rdma_disable_ibverbs=True)
    assert config.as_dict() == before and config.explicit() == {}


def test_to_env_passes_what_a_child_needs():
    c = Config({})
    assert c.to_env() == {}
    c.heartbeat_timeout, c.interrupt_remote, c.stop_timeout = 9.5, False, 5.0  # 5.0: the default
    c.rdma_transport = "tcp"
    assert c.to_env() == {"MONARCH_HEARTBEAT_TIMEOUT": "9.5", "MONARCH_INTERRUPT_REMOTE": "0",
                          "MONARCH_STOP_TIMEOUT": "5.0", "MONARCH_RDMA_TRANSPORT": "tcp"}
    child = Config(c.to_env())
    assert child.as_dict() == c.as_dict()
    assert Config({"MONARCH_ADMIN": "false"}).to_env() == {"MONARCH_ADMIN": "0"}


def test_to_env_of_the_global_config(clean):
    with configured(debug_policy="continue"):
        assert config.to_env()["MONARCH_DEBUG_POLICY"] == "continue"
    assert TOKEN_ENV not in config.to_env()


def test_debugger_settings_are_config(clean):
    from runtime.debugging import settings

    settings.set_policy("continue")
    settings.set_timeout(3)
    assert config.debug_policy == "continue" and config.debug_timeout == 3.0
    settings.reset()
    assert "debug_policy" not in config.explicit() and "debug_timeout" not in config.explicit()


def test_runtime_exports_configure():
    assert runtime.configure is configure and runtime.configured is configured
    assert {"configure", "configured"} <= set(runtime.__all__)


def test_secret_not_in_repr():
    c = Config({"MONARCH_SESSION_TOKEN": "ab" * 16})
    assert "abab" not in repr(c) and "rdma_session_token=***" in repr(c)


_seen_by_parametrized: list = []


@runtime.config.parametrize_config(stop_timeout={1, 5}, actor_queue_dispatch={True, False})
def test_parametrize_config_runs_each_combination_under_configured(clean):
    """Monarch's decorator: one run per combination, each under configured(...); Monarch
    names with no equivalent here (actor_queue_dispatch) are accepted and ignored."""
    _seen_by_parametrized.append(config.stop_timeout)
    assert config.explicit() == {"stop_timeout": config.stop_timeout}


def test_parametrize_config_made_four_runs_and_restores():
    assert sorted(_seen_by_parametrized) == [1.0, 1.0, 5.0, 5.0]
    assert "stop_timeout" not in config.explicit()


def test_parametrize_config_checks_at_decoration():
    with pytest.raises(TypeError, match="unknown setting 'stop_timout'"):
        runtime.config.parametrize_config(stop_timout={1})
    with pytest.raises(TypeError, match="collection of values"):
        runtime.config.parametrize_config(stop_timeout=1)
    with pytest.raises(ValueError):
        runtime.config.parametrize_config(stop_timeout={-1})


_seen_pointwise: list = []


@runtime.config.parametrize_config_pointwise(stop_timeout=[1, 5],
                                              rdma_disable_ibverbs=[True, False])
def test_parametrize_config_pointwise_runs_each_index(clean):
    """Monarch's pointwise sweep: values in lockstep, each run under configured(...); an
    ignored Monarch name (rdma_disable_ibverbs) reads back through get_global_config(), as
    Monarch's RDMA tests branch on it."""
    got = runtime.config.get_global_config()
    _seen_pointwise.append((config.stop_timeout, got["rdma_disable_ibverbs"]))
    assert runtime.config.get_runtime_config()["rdma_disable_ibverbs"] is got["rdma_disable_ibverbs"]


def test_parametrize_config_pointwise_made_two_runs_and_restores():
    assert sorted(_seen_pointwise) == [(1.0, True), (5.0, False)]
    assert "rdma_disable_ibverbs" not in runtime.config.get_global_config()
    with pytest.raises(ValueError, match="same number of values"):
        runtime.config.parametrize_config_pointwise(stop_timeout=[1, 5], rdma_disable_ibverbs=[True])


def test_ignored_monarch_setting_reads_back_until_cleared():
    with pytest.warns(UserWarning, match="no equivalent"):
        configure(rdma_allow_tcp_fallback=False)
    try:
        assert runtime.config.get_global_config()["rdma_allow_tcp_fallback"] is False
    finally:
        runtime.config.clear_runtime_config()
    assert "rdma_allow_tcp_fallback" not in runtime.config.get_runtime_config()


def test_spawn_env_carries_settings_set_here_once_even_after_their_block(clean):
    """A setting set in a configured() block that ended goes to procs spawned later with its
    value now: a host agent started inside the block keeps the old value in its
    environment, and the proc's own environment must override it."""
    with configured(max_message_bytes=4 << 20):
        assert config.spawn_env()["MONARCH_MAX_MESSAGE_BYTES"] == str(4 << 20)
    assert config.spawn_env()["MONARCH_MAX_MESSAGE_BYTES"] == str(2 << 30)
    assert "MONARCH_MAX_MESSAGE_BYTES" not in config.to_env()  # agents: as before
