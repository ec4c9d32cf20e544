"""The launcher (``python launch.py [--model PATH] ...``, or ``lazyserve``): start, supervise and stop
every lazyserve process. `args` reads the flags (in groups), `listen` checks the HTTP address
before anything starts, `supervisor` spawns and tends the children, `main` ties them together.

Launch resolves the model, writes `ServerArgs` into a private run directory, spawns the
tokenizer, scheduler, worker and detokenizer processes, waits for each one's Hello and
Ready on its control socket (failing at once with a child's error if it dies or reports
failure), prints the URL and run directory, then supervises:

- a detokenizer replica that dies is reported to the scheduler (`ReplicaExited`: it moves
  the replica's requests) and restarted; one that exits 0 (drained) is not;
- the worker (with ``--tp N``: its N ranks, one group; any rank's exit kills the others,
  which would block in a collective) when it exits, is reported to the scheduler (`WorkerExited`: it fails the
  requests on the device with a 503, keeps the waiting ones and waits) and restarted as the
  next generation, which reloads the model;
- restarts wait `RESTART_BACKOFF_S`, longer while a child keeps dying soon after its start;
- the scheduler's or the tokenizer's exit stops the server with code 1. They are not
  restarted: the scheduler holds every request's state (queue, generated tokens, KV
  accounting, replica routing) and the tokenizer every client connection, so a new one
  could not resume the requests; the server fails whole and fast, for an outside supervisor.

Shutdown: SIGTERM and SIGINT (Ctrl-C) both drain first. The HTTP front refuses new requests
with a 503 (``/health`` turns 503) while the requests it already accepted, running or
queued, finish, for up to ``--shutdown-timeout`` seconds (default 30, the default grace
period of a Kubernetes pod; 0: no drain); a worker or replica that dies meanwhile is
restarted as while serving. A second SIGTERM or SIGINT ends the drain at
once. Then launch stops the children in order (HTTP front first), which fails the requests
still in flight with a 503 (an SSE error event then ``[DONE]`` on a stream), removes the run
directory and exits 0.
Each child runs in a session (process group) of its own, so a SIGTERM or SIGINT sent to launch's
process group drains as one sent to launch does, and gets SIGTERM from the kernel if launch
itself dies (`protocol.process.die_with_parent`). A SIGTERM (or SIGHUP) sent to every process
at once (systemd's ``KillMode=control-group``), to the children alone (``pkill lazyserve``) or
to one of them drains as well: while launch lives a child passes it on as `DRAIN_SIGNAL` and
keeps serving until launch stops it with `STOP_SIGNAL` (`protocol.process.install_stop_handlers`).
SIGHUP to launch drains like SIGTERM; `STOP_SIGNAL` sent to launch is ignored.
"""
