"""`main`: the launcher's run from flags to exit code: check the model and the address, make
the run directory, write `ServerArgs`, start and supervise the children, drain and stop."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from launcher.args import parse_args, server_args
from launcher.listen import check_listen
from launcher.supervisor import Launcher, install_signal_handlers
from protocol import endpoints
from protocol.endpoints import SERVER_ARGS_FILE, STOPPING_FILE
from protocol.model_source import resolve_model
from protocol.process import configure_logging
from text.hf_tokenizer import served_context_length
from worker_proc.cpu.blas import find_fast_blas, thread_env, usable_cores
from worker_proc.tp.link import write_key
from worker_proc.tp.setup import check_heads, model_heads, ranks_on_host


def main(argv: list[str] | None = None) -> int:
    """Run the server; returns the process exit code."""
    ns = parse_args(argv)
    log = configure_logging(ns.log_level, ns.log_format, proc="launch")
    try:
        source = resolve_model(ns.model, ns.served_model_name)
    except (OSError, ValueError) as e:
        log.error("cannot load model", error=str(e))
        return 2
    if ns.context_length is not None:
        try:
            served_context_length(source, ns.context_length)
        except (OSError, ValueError) as e:
            log.error("start-up failed", error=str(e))
            return 2
    if ns.tp > 1:
        try:
            check_heads(*model_heads(source), ns.tp)
        except (OSError, ValueError) as e:
            log.error("start-up failed", error=str(e))
            return 1
    try:
        check_listen(ns.host, ns.port)
    except OSError as e:
        log.error("start-up failed", error=f"cannot listen on {ns.host}:{ns.port}: {e.strerror or e}")
        return 1
    own_run_dir = ns.run_dir is None or not Path(ns.run_dir).exists()
    try:
        run_dir = endpoints.make_run_dir(ns.run_dir)
    except (OSError, ValueError) as e:
        log.error("start-up failed", error=f"--run-dir: {e}" if ns.run_dir else str(e))
        return 2
    blas = find_fast_blas() or ""
    cores = usable_cores()
    here = ranks_on_host(ns.dist_ring, 0) if ns.hostfile else ns.tp
    blas_env = thread_env(ns.blas_threads, max(1, cores // here), dict(os.environ))  # --tp ranks share the cores
    if ns.hostfile:
        write_key(Path(ns.dist_key_file))
    args = server_args(ns, source, run_dir, blas, blas_env)
    args.save()
    log.info(
        "starting",
        model=source.path,
        run_dir=str(run_dir),
        api_key="set" if ns.api_key else "none",
        cores=cores,
        cpu_blas=blas or None,
        cpu_blas_env=blas_env,
        note="the worker preloads cpu_blas only when MLX runs on the CPU",
    )
    launcher = Launcher(args, log)
    if ns.hostfile:
        log.info(
            "start the other ranks on their hosts (with copies of the hostfile and key file)",
            command=f"python -m worker_proc --rank R --hostfile {ns.hostfile} "
            + (f"--starting-port {ns.starting_port} " if ns.starting_port is not None else "")
            + f"--attach {ns.dist_init_addr} --dist-key-file {ns.dist_key_file}",
            ranks=list(range(1, ns.tp)),
            ring=ns.dist_ring,
        )

    install_signal_handlers(launcher)
    code = 0
    try:
        launcher.spawn_all()
        launcher.wait_ready()
        launcher.announce_ready()
        print(
            f"lazyserve ready: http://{ns.host}:{ns.port} (model {source.served_name}, run dir {run_dir})", flush=True
        )
        print(f"more detokenizer replicas: python -m detokenizer_proc --attach {run_dir}", flush=True)
        code = launcher.supervise()
        if code == 0:
            code = launcher.drain(ns.shutdown_timeout)
    except KeyboardInterrupt:
        code = 0
    except RuntimeError as e:
        log.error("start-up failed", error=str(e))
        code = 1
    finally:
        launcher.stop_all()
        if own_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:  # attached replicas watch this file: the server is gone
            (run_dir / SERVER_ARGS_FILE).unlink(missing_ok=True)
            (run_dir / STOPPING_FILE).unlink(missing_ok=True)
        log.info("stopped", code=code)
    return code
