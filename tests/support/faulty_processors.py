"""A test hook for ``--logit-processor-module tests.support.faulty_processors``: processors that
leave the logits as they are for the request's first ``custom_params`` ``after`` tokens
(default 0), then fail in one of the ways operator code can: ``raises`` reads an argument
the request did not pass (KeyError), ``exits`` raises SystemExit, ``lazy`` returns an array
whose evaluation fails (the inverse of a singular matrix: MLX reports it only when the
graph runs), ``wrong_shape`` returns a slice of the row."""

import mlx.core as mx


def _failing(fail):
    """A processor that passes its row through while fewer than ``after`` tokens were
    generated, then returns ``fail(logits, args)``."""

    def processor(logits, output_ids, args):
        if len(output_ids) < args.get("after", 0):
            return logits
        return fail(logits, args)

    return processor


def _exit(logits, args):
    raise SystemExit(3)


def _singular(logits, args):
    return logits + mx.linalg.inv(mx.zeros((2, 2)), stream=mx.cpu).sum()


LOGIT_PROCESSORS = {
    "raises": _failing(lambda logits, args: logits + args["missing"]),
    "exits": _failing(_exit),
    "lazy": _failing(_singular),
    "wrong_shape": _failing(lambda logits, args: logits[:10]),
}
FAULTS = {"raises": "KeyError", "exits": "SystemExit", "lazy": "RuntimeError", "wrong_shape": "ValueError"}
"""Processor name -> the exception type its failure is reported with."""
