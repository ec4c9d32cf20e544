"""Unit tests of the wire protocol (DESIGN.md §3): every message round-trips through its
channel's decoder, channels reject each other's messages, and the small helpers of
`protocol/` (enums, run directory, model resolution, ServerArgs) behave as documented."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec
import pytest

from protocol import PROTOCOL_VERSION, codec, endpoints
from protocol import messages as m
from protocol.config import ModelSource, ServerArgs
from protocol.enums import (
    WORKER_FORWARD_MODES,
    FinishReason,
    ForwardMode,
    GrammarKind,
    ReplicaState,
    ReqField,
    Role,
    describe_modes,
)
from protocol.model_source import GGUF_MAGIC, resolve_model

# One example per concrete message class, with non-default values wherever a field has a
# default, so that omit_defaults cannot hide a field that fails to round-trip.
SAMPLING = m.SamplingParams(
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    seed=1234,
    logit_bias={5: -100.0, 17: 2.5},
    min_p=0.05,
    frequency_penalty=0.5,
    presence_penalty=-0.25,
    repetition_penalty=1.2,
    min_tokens=3,
    min_tokens_ids=[2, 7],
    top_logprobs=5,
    token_ids_logprob=[3, 9],
    logprob_start_len=2,
    logit_processor="no_digits",
    logit_processor_args='{"n": 1}',
)
LOGPROBS = m.TokenLogprobs([10, 11], [-0.5, -1.25], [[10, 4], [11, 3]], [[-0.5, -2.0], [-1.25, -1.5]], [[-3.0], [-4.5]])
ENTRIES = m.LogprobEntries(
    3,
    [10, 11],
    [" hé", ""],
    [b" h\xc3\xa9", b"\xf0\x9f"],
    [-0.5, -1.25],
    [[10], [11]],
    [[" hé"], ["\ufffd"]],
    [[b" h\xc3\xa9"], [b"\xf0\x9f"]],
    [[-0.5], [-1.25]],
    [[-3.0], [-4.5]],
)
DETOK = m.DetokParams(
    stop=["</s>", "\n\n", "日本"],
    include_stop_str_in_output=True,
    skip_special_tokens=False,
    spaces_between_special_tokens=False,
    prompt_tail_ids=[1, 520, 9531, 198],
    logprob_context_ids=[520, 9531],
)

EXAMPLES: dict[type, list[msgspec.Struct]] = {
    # ToScheduler
    m.GenerateReq: [
        m.GenerateReq("req-1", [1, 2, 3, 49151], 16, SAMPLING, DETOK, [2], [7, 8]),
        m.GenerateReq("req-defaults", [42], 0),
        m.GenerateReq(
            "req-1-2", [1, 2], 4, SAMPLING, DETOK, [2], [], m.GrammarSpec(GrammarKind.REGEX, "[a-z]+"), "req-1"
        ),
    ],
    m.AbortReq: [m.AbortReq("req-1"), m.AbortReq("req-2", FinishReason.STOP)],
    m.SchedulerShutdown: [m.SchedulerShutdown()],
    m.ReplicaHeartbeat: [m.ReplicaHeartbeat(3, 4321)],
    m.DrainReplica: [m.DrainReplica(2)],
    m.ReplicaExited: [m.ReplicaExited(1, 4321, "was killed by SIGKILL"), m.ReplicaExited(0)],
    m.WorkerExited: [m.WorkerExited(4321, 2, "was killed by SIGKILL"), m.WorkerExited(4321, 0)],
    m.DeliveredChars: [m.DeliveredChars(["a", "b"], [17, -1])],
    m.StreamsClosed: [m.StreamsClosed(["a", "b"])],
    m.HealthProbe: [m.HealthProbe(7)],
    m.FlushCache: [m.FlushCache(3)],
    # ToWorker
    m.Launch: [
        m.Launch(3, ForwardMode.EXTEND, m.ForwardBatch(["a", "b"], [[1, 2], [3]], [SAMPLING, m.SamplingParams()])),
        m.Launch(4, ForwardMode.DECODE, m.ForwardBatch(["a", "b"])),
        m.Launch(
            5,
            ForwardMode.MIXED,
            m.ForwardBatch(["a", "c"], [[], [5, 6]], [None, SAMPLING], [True, False], [[], [11, 12, 13]]),
        ),
        m.Launch(
            7,
            ForwardMode.EXTEND,
            m.ForwardBatch(["a"], [[4]], [SAMPLING], [True], [[1, 2]], [[8, 9]], [1], [0], [b"\xff\xff\x00\x01"]),
        ),
    ],
    m.ChainDecode: [m.ChainDecode(6, 5)],
    m.StoreKV: [m.StoreKV(["a", "b"], [0, 3], [[4, 5, 6], [9]])],
    m.Finalize: [m.Finalize(3)],
    m.WorkerAbort: [m.WorkerAbort(["a", "b"]), m.WorkerAbort([])],
    m.WorkerShutdown: [m.WorkerShutdown()],
    # FromWorker
    m.LaunchResult: [
        m.LaunchResult(3, ["a", "b"], [10, 2]),
        m.LaunchResult(4, ["a"], [], "boom: out of memory"),
        m.LaunchResult(5, ["a", "b"], [10, -1], "", [LOGPROBS, None], [None, LOGPROBS], ["boom", ""]),
        m.LaunchResult(6, ["a"], [10], generation=3),
    ],
    m.WorkerReady: [
        m.WorkerReady(4096, 46080, 8192),
        m.WorkerReady(4096, 46080, 8192, 49152, ["no_digits"]),
        m.WorkerReady(4096, 46080, 8192, 49152, ["no_digits"], 2),
        m.WorkerReady(4096, 46080, 8192, 49152, [], 0, 0, 0, 4),
    ],
    # ToDetokenizer
    m.DetokSeed: [m.DetokSeed("a", DETOK, 17), m.DetokSeed("b", m.DetokParams(), 1), m.DetokSeed("c", DETOK, 4, 2, 35)],
    m.BatchTokenOut: [
        m.BatchTokenOut(
            ["a", "b", "c"],
            [[10, 11], [], [12]],
            [2, 5, 1],
            [None, FinishReason.STOP, FinishReason.LENGTH],
            [None, 2, None],
        ),
        m.BatchTokenOut(["a"], [[10]], [1], [None]),
        m.BatchTokenOut(
            ["a", "b"], [[10, 11], [5]], [2, 1], [None, None], [None, None], [LOGPROBS, None], [LOGPROBS, None], [0, 0]
        ),
    ],
    m.DetokAbort: [m.DetokAbort("a")],
    m.DetokShutdown: [m.DetokShutdown()],
    m.ReplicaWelcome: [m.ReplicaWelcome(3)],
    m.ReplicaRefused: [m.ReplicaRefused("this detokenizer speaks protocol 1, the server speaks 2")],
    # ToTokenizer
    m.BatchStrOut: [
        m.BatchStrOut(
            ["a", "b", "c", "d"],
            ["héllo 🌶️", "", "日本語", "x"],
            [3, 4, 5, 6],
            [None, FinishReason.STOP, FinishReason.STOP, FinishReason.ABORT],
            [None, "\n\n", 2, None],
        ),
        m.BatchStrOut(["a"], ["x"], [1], [None]),
        m.BatchStrOut(["a", "b"], ["x", ""], [1, 2], [None, FinishReason.LENGTH], [None, None], [0, 3], [12, 40]),
        m.BatchStrOut(
            ["a", "b"], ["x", ""], [1, 2], [None, None], [None, None], [0, 0], [0, 0], [ENTRIES, None], [None, ENTRIES]
        ),
    ],
    m.DeliveredQuery: [m.DeliveredQuery(["a", "b"])],
    m.DetokStatus: [
        m.DetokStatus(
            [0, 1, 2],
            [100, 0, 300],
            [ReplicaState.LIVE, ReplicaState.GONE, ReplicaState.DRAINING],
            [False, False, True],
            [3, 0, 1],
            [10, 4, 2],
            [0, 0, 3],
            2,
            1,
            1,
        ),
        m.DetokStatus([], [], [], [], [], [], []),
    ],
    m.ReqError: [
        m.ReqError("a", 400, "request id 'a' is already in use"),
        m.ReqError("b", 400, "x", ReqField.LOGIT_PROCESSOR),
    ],
    m.ServerReady: [m.ServerReady()],
    m.WorkerStatus: [m.WorkerStatus(False, "worker was killed by SIGKILL"), m.WorkerStatus(True)],
    m.HealthAnswer: [m.HealthAnswer(7)],
    m.ResolvedSettings: [
        m.ResolvedSettings({"max_total_tokens": 4096, "context_length": 2048, "decode_graph_max_bs": 4})
    ],
    m.CacheFlushed: [m.CacheFlushed(3, 120, 16)],
    m.SchedulerStats: [m.SchedulerStats(2, 1, 4096, 4000, 50, 46, 1000, 800, 3, 17)],
    m.TokenizerShutdown: [m.TokenizerShutdown(), m.TokenizerShutdown("the scheduler was killed by SIGKILL")],
    m.TokenizerDrain: [m.TokenizerDrain()],
    # Control
    m.Hello: [m.Hello(Role.WORKER, 0, 4321, PROTOCOL_VERSION)],
    m.Ready: [
        m.Ready(Role.DETOKENIZER, 2, "info text"),
        m.Ready(Role.SCHEDULER, 0),
        m.Ready(Role.DETOKENIZER, 4, "", 77),
    ],
    m.Failed: [m.Failed(Role.TOKENIZER, 0, "ValueError: bad model")],
    m.Drained: [m.Drained(Role.TOKENIZER)],
}


def all_subclasses(cls: type) -> list[type]:
    """Every subclass of `cls`, at any depth."""
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(all_subclasses(sub))
    return out


def channel_of(cls: type) -> type:
    for base in codec.CHANNELS:
        if issubclass(cls, base):
            return base
    raise AssertionError(f"{cls.__name__} belongs to no channel")


ALL_MESSAGES = [(cls, i, msg) for cls, msgs in EXAMPLES.items() for i, msg in enumerate(msgs)]


def test_every_message_class_has_an_example():
    classes = [sub for base in codec.CHANNELS for sub in all_subclasses(base)]
    assert len(classes) == len(set(classes)) >= 19
    missing = [c.__name__ for c in classes if c not in EXAMPLES]
    assert not missing, f"message classes without a round-trip example: {missing}"
    # and no example for a class that is not a message of a channel
    assert set(EXAMPLES) == set(classes)


def test_channels_cover_every_message_struct_in_module():
    """Every tagged Struct defined in protocol.messages belongs to exactly one channel."""
    tagged = [
        obj
        for obj in vars(m).values()
        if isinstance(obj, type)
        and issubclass(obj, msgspec.Struct)
        and obj.__struct_config__.tag is not None
        and obj not in codec.CHANNELS
    ]
    assert tagged, "no tagged messages found"
    for cls in tagged:
        assert sum(issubclass(cls, base) for base in codec.CHANNELS) == 1, cls.__name__


@pytest.mark.parametrize(("cls", "i", "msg"), ALL_MESSAGES, ids=[f"{c.__name__}-{i}" for c, i, _ in ALL_MESSAGES])
def test_round_trip(cls, i, msg):
    assert type(msg) is cls
    raw = codec.encoder.encode(msg)
    assert isinstance(raw, bytes) and raw
    decoded = codec.CHANNELS[channel_of(cls)].decode(raw)
    assert type(decoded) is cls
    assert decoded == msg
    # enums come back as enums, not bare ints
    for name in cls.__struct_fields__:
        value = getattr(msg, name)
        if isinstance(value, (FinishReason, ForwardMode, Role)):
            assert type(getattr(decoded, name)) is type(value)
    # a second trip gives identical bytes
    assert codec.encoder.encode(decoded) == raw


def test_round_trip_preserves_enum_types_in_columns():
    msg = EXAMPLES[m.BatchTokenOut][0]
    decoded = codec.to_detokenizer.decode(codec.encoder.encode(msg))
    assert decoded.finish_reasons == [None, FinishReason.STOP, FinishReason.LENGTH]
    assert type(decoded.finish_reasons[1]) is FinishReason
    launch = codec.to_worker.decode(codec.encoder.encode(EXAMPLES[m.Launch][0]))
    assert type(launch.mode) is ForwardMode and launch.mode == ForwardMode.EXTEND
    assert launch.batch.sampling[0].logit_bias == {5: -100.0, 17: 2.5}


def test_replica_states_come_back_as_enums():
    decoded = codec.to_tokenizer.decode(codec.encoder.encode(EXAMPLES[m.DetokStatus][0]))
    assert decoded.states == [ReplicaState.LIVE, ReplicaState.GONE, ReplicaState.DRAINING]
    assert all(type(s) is ReplicaState for s in decoded.states)
    assert [s.api_str for s in ReplicaState] == ["starting", "live", "draining", "gone"]


def test_messages_are_frozen():
    msg = m.AbortReq("a")
    with pytest.raises(AttributeError):
        msg.rid = "b"  # type: ignore[misc]


def test_shorter_array_from_older_sender_takes_defaults():
    """Field order is the wire contract (append only): trailing fields may be absent."""
    raw = msgspec.msgpack.encode(["AbortReq", "a"])
    assert codec.to_scheduler.decode(raw) == m.AbortReq("a", FinishReason.ABORT)
    raw = msgspec.msgpack.encode(["BatchTokenOut", ["a"], [[5]], [1], [None]])
    assert codec.to_detokenizer.decode(raw) == m.BatchTokenOut(["a"], [[5]], [1], [None], [])
    # a required field may not be absent
    with pytest.raises(msgspec.ValidationError):
        codec.to_scheduler.decode(msgspec.msgpack.encode(["GenerateReq", "a", [1]]))


@pytest.mark.parametrize(("cls", "i", "msg"), ALL_MESSAGES, ids=[f"{c.__name__}-{i}" for c, i, _ in ALL_MESSAGES])
def test_other_channels_reject_message(cls, i, msg):
    raw = codec.encoder.encode(msg)
    own = channel_of(cls)
    others = [base for base in codec.CHANNELS if base is not own]
    assert len(others) == len(codec.CHANNELS) - 1 == 5
    for base in others:
        with pytest.raises(msgspec.ValidationError):
            codec.CHANNELS[base].decode(raw)


@pytest.mark.parametrize("garbage", [b"", b"\xc1", b"\xc1garbage", b"\xdc", b"\xc4"])
def test_garbage_bytes_raise_decode_error(garbage):
    for decoder in codec.CHANNELS.values():
        with pytest.raises(msgspec.DecodeError) as info:
            decoder.decode(garbage)
        # malformed msgpack, not merely a wrongly typed (valid) value
        assert not isinstance(info.value, msgspec.ValidationError)


@pytest.mark.parametrize("garbage", [b"\x92\xa8AbortReq\xc1", b"\x93\xa8AbortReq\xa1a\x02\x00"])
def test_malformed_after_valid_tag_raises_decode_error(garbage):
    with pytest.raises(msgspec.DecodeError) as info:
        codec.to_scheduler.decode(garbage)
    assert not isinstance(info.value, msgspec.ValidationError)


def test_truncated_message_raises_decode_error():
    raw = codec.encoder.encode(EXAMPLES[m.GenerateReq][0])
    with pytest.raises(msgspec.DecodeError):
        codec.to_scheduler.decode(raw[: len(raw) // 2])


@pytest.mark.parametrize("value", [42, "AbortReq", ["NoSuchMessage", "x"], ["AbortReq"], ["AbortReq", 5], {"rid": "x"}])
def test_well_formed_but_invalid_values_raise_validation_error(value):
    with pytest.raises(msgspec.ValidationError):
        codec.to_scheduler.decode(msgspec.msgpack.encode(value))


def test_finish_reason_api_str():
    assert FinishReason.STOP.api_str == "stop"
    assert FinishReason.LENGTH.api_str == "length"
    assert FinishReason.ABORT.api_str == "abort"
    assert [int(r) for r in FinishReason] == [0, 1, 2]


def test_forward_mode_values():
    assert ForwardMode.IDLE == 0
    assert ForwardMode.DECODE == 1
    assert ForwardMode.EXTEND == 2
    assert ForwardMode.MIXED == 3
    assert ForwardMode.TARGET_VERIFY == 4
    assert [mode.name for mode in ForwardMode] == ["IDLE", "DECODE", "EXTEND", "MIXED", "TARGET_VERIFY"]
    assert (
        frozenset({ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY})
        == WORKER_FORWARD_MODES
    )
    assert describe_modes(WORKER_FORWARD_MODES) == "DECODE, EXTEND, MIXED, TARGET_VERIFY"
    assert describe_modes(frozenset(ForwardMode)) == "IDLE, DECODE, EXTEND, MIXED, TARGET_VERIFY"


def test_make_run_dir_default_is_private():
    path = endpoints.make_run_dir()
    try:
        assert path.is_dir()
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        assert path.name.startswith("lazyserve-")
        assert list(path.iterdir()) == []
    finally:
        path.rmdir()


def test_make_run_dir_given_path_is_created_private(tmp_path):
    target = tmp_path / "a" / "b" / "run"
    path = endpoints.make_run_dir(str(target))
    assert path == target.resolve()
    assert path.is_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_make_run_dir_tightens_existing_dir(tmp_path):
    target = tmp_path / "run"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    path = endpoints.make_run_dir(str(target))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_make_run_dir_refuses_a_directory_holding_other_files(tmp_path):
    """`--run-dir /tmp` (or a home or checkout directory) was made mode 0700, sticky bit and
    all: other users lost the directory. A directory holding files lazyserve did not write
    is now refused, its mode left as it was."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "someone_elses_file").write_text("x")
    with pytest.raises(ValueError, match="holds files lazyserve did not write \\(someone_elses_file\\)"):
        endpoints.make_run_dir(str(shared))
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_make_run_dir_takes_an_earlier_runs_leftovers(tmp_path):
    """What a killed launch leaves (its args, sockets, grammar tokenizer, TP hostfile) is no
    reason to refuse the directory."""
    target = tmp_path / "run"
    target.mkdir(mode=0o755)
    for name in (
        endpoints.SERVER_ARGS_FILE,
        endpoints.GRAMMAR_TOKENIZER_FILE,
        "grammar_tokenizer.json.tmp77",
        "control.sock",
        "detokenizer-0.sock",
        "tp-hostfile-0.json",
    ):
        (target / name).write_text("")
    assert endpoints.make_run_dir(str(target)) == target.resolve()
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


def test_make_run_dir_refuses_one_a_running_server_uses(tmp_path):
    """A second server given a live server's run directory would bind over its sockets."""
    import socket

    target = tmp_path / "run"
    target.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(target / "control.sock"))
        listener.listen(1)
        with pytest.raises(ValueError, match="is in use by a running lazyserve server"):
            endpoints.make_run_dir(str(target))
    finally:
        listener.close()
    assert endpoints.make_run_dir(str(target)) == target.resolve()  # the socket file stays; nothing listens


def test_make_run_dir_refuses_a_path_too_long_for_its_sockets(tmp_path):
    """A path leaving no room for the sockets failed in launch with ZeroMQ's traceback, after
    it had created the directory."""
    import zmq

    room = zmq.IPC_PATH_MAX_LEN - len(endpoints.LONGEST_SOCKET_NAME) - 1
    fits = tmp_path / ("d" * (room - len(os.fsencode(tmp_path)) - 1))
    assert len(os.fsencode(endpoints.attached_detokenizer(fits, 4194304)[len("ipc://") :])) == zmq.IPC_PATH_MAX_LEN
    assert endpoints.make_run_dir(str(fits)) == fits
    too_long = tmp_path / ("d" * (room - len(os.fsencode(tmp_path))))
    with pytest.raises(ValueError, match=f"too long for its ipc:// sockets.*leaves {room} for the directory"):
        endpoints.make_run_dir(str(too_long))
    assert not too_long.exists()


def test_make_run_dir_refuses_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        endpoints.make_run_dir(str(tmp_path / "f"))


def test_endpoints_live_in_run_dir(tmp_path):
    eps = [
        endpoints.control(tmp_path),
        endpoints.scheduler(tmp_path),
        endpoints.worker(tmp_path),
        endpoints.worker_results(tmp_path),
        endpoints.tokenizer(tmp_path),
        endpoints.detokenizer(tmp_path, 0),
        endpoints.detokenizer(tmp_path, 1),
        endpoints.scheduler_control(tmp_path),
        endpoints.attached_detokenizer(tmp_path, 1),
    ]
    assert all(e.startswith(f"ipc://{tmp_path}/") for e in eps)
    assert len(set(eps)) == len(eps)
    assert endpoints.detokenizer(tmp_path, 3) == f"ipc://{tmp_path}/detokenizer-3.sock"
    assert endpoints.attached_detokenizer(tmp_path, 4321) == f"ipc://{tmp_path}/detokenizer-pid4321.sock"


def test_resolve_model_missing_path(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(FileNotFoundError) as info:
        resolve_model(str(missing))
    assert str(missing) in str(info.value)


def test_resolve_model_hub_id_says_how_to_download(tmp_path, monkeypatch):
    """A new user from vLLM / SGLang passes a Hugging Face repo id; the error only said the
    path does not exist. It now says the server does not download and how to get the files;
    a missing local path keeps the plain message."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert str(info.value) == (
        "model path does not exist: HuggingFaceTB/SmolLM2-135M-Instruct (lazyserve loads local files only and "
        "does not download models: to serve the Hugging Face repo HuggingFaceTB/SmolLM2-135M-Instruct, download "
        "it first, e.g. `hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir DIR`, then pass --model DIR)"
    )
    for local in (str(tmp_path / "a" / "b"), "models/x.gguf", "./a/b", "nothing"):
        with pytest.raises(FileNotFoundError) as info:
            resolve_model(local)
        assert "download" not in str(info.value), local


def test_resolve_model_non_gguf_file(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(ValueError) as info:
        resolve_model(str(bogus))
    assert str(bogus) in str(info.value)
    assert "GGUF" in str(info.value)


def test_resolve_model_dir_without_config(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError) as info:
        resolve_model(str(folder))
    assert str(folder) in str(info.value)
    assert "config.json" in str(info.value)


@pytest.mark.parametrize("config", ["{}", '{"model_type": null}', '{"model_type": 3}'])
def test_resolve_model_config_without_model_type(tmp_path, config):
    """A config.json without a model_type string is refused by launch at once, naming the
    field, instead of a worker failing later with ``KeyError: 'model_type'``."""
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(ValueError) as info:
        resolve_model(str(tmp_path))
    assert str(info.value) == (
        f'{tmp_path / "config.json"} has no "model_type" string (the architecture, '
        'such as "llama"), which loading the model needs'
    )


def test_resolve_model_valid_sources(tmp_path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(GGUF_MAGIC + b"\x03\x00\x00\x00")
    assert resolve_model(str(gguf)) == ModelSource("gguf", str(gguf.resolve()), "tiny")
    assert resolve_model(str(gguf), "served").served_name == "served"
    folder = tmp_path / "hf-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    assert resolve_model(str(folder)) == ModelSource("hf", str(folder.resolve()), "hf-model")
    assert resolve_model(str(folder), "x").served_name == "x"


def test_server_args_save_load_round_trip(tmp_path):
    args = ServerArgs(
        model=ModelSource("hf", "/models/tiny", "tiny"),
        run_dir=str(tmp_path),
        host="0.0.0.0",
        port=31234,
        detokenizers=3,
        max_running_requests=8,
        max_prefill_tokens=512,
        context_length=1024,
        load_format="dummy",
        log_level="debug",
        log_format="json",
        blas="/usr/lib/libblas.so.3",
        blas_env={"OPENBLAS_NUM_THREADS": "1", "OPENBLAS_THREAD_TIMEOUT": "4"},
    )
    path = args.save()
    assert path == Path(tmp_path) / endpoints.SERVER_ARGS_FILE
    assert path.is_file()
    loaded = ServerArgs.load(tmp_path)
    assert loaded == args
    assert ServerArgs.load(str(tmp_path)) == args
    # defaults round-trip too
    plain = ServerArgs(model=ModelSource("gguf", "/m.gguf", "m"), run_dir=str(tmp_path))
    plain.save()
    assert ServerArgs.load(tmp_path) == plain
    assert ServerArgs.load(tmp_path).context_length is None


def test_server_args_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        ServerArgs.load(tmp_path / "nowhere")
    (tmp_path / endpoints.SERVER_ARGS_FILE).write_text('{"run_dir": 5}')
    with pytest.raises(msgspec.ValidationError):
        ServerArgs.load(tmp_path)
