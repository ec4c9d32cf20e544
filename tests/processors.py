"""A test hook for ``--logit-processor-module tests.processors`` (the session's tiny-model
server): the processors of `tests.forced_tokens` and of `tests.faulty_processors` together."""

from tests import faulty_processors, forced_tokens

LOGIT_PROCESSORS = {**forced_tokens.LOGIT_PROCESSORS, **faulty_processors.LOGIT_PROCESSORS}
