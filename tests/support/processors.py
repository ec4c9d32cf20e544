"""A test hook for ``--logit-processor-module tests.support.processors`` (the session's tiny-model
server): the processors of `tests.support.forced_tokens` and of `tests.support.faulty_processors` together."""

from tests.support import faulty_processors, forced_tokens

LOGIT_PROCESSORS = {**forced_tokens.LOGIT_PROCESSORS, **faulty_processors.LOGIT_PROCESSORS}
