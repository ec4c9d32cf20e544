"""Request shapes of OpenAI tool calling (pydantic): tool definitions, ``tool_choice``, and
the calls of earlier assistant turns. Unknown keys inside them are a 400 naming the key."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StrictBool, StrictStr, Tag

FUNCTION_NAME = r"^[a-zA-Z0-9_.-]{1,64}$"
"""OpenAI's rule for function names (and ``.``, which MCP tool names use)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Strict):
    """A callable function: name, what it does, its arguments' JSON schema (an object
    schema; absent: no arguments). strict: under ``tool_choice: "auto"`` its calls' arguments
    are enforced by a grammar (`tools.grammar.auto_calls`); a forced call's always are."""

    name: StrictStr = Field(pattern=FUNCTION_NAME)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolDef(_Strict):
    """One entry of ``tools``: only function tools exist on chat completions."""

    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: StrictStr


class NamedToolChoice(_Strict):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"]
    function: FunctionName


def only_function_choices(value: Any) -> Any:
    """A ``tool_choice`` object of another type than ``function`` (``allowed_tools``,
    ``custom``, a hosted tool) refused with a message saying what is served (pydantic's own
    would list the string values only); one without a type is left to the function choice's
    check, which says that ``type`` is missing."""
    if isinstance(value, dict) and "type" in value and value["type"] != "function":
        kind = value["type"]
        raise ValueError(
            f'a tool_choice of type {kind!r} is not supported by this server: give "none", '
            f'"auto", "required" or a function to call (type "function")'
        )
    return value


def _choice_kind(value: Any) -> str:
    """The member of a ``tool_choice`` union that `value` is checked against: ``dict`` (the
    named function) for an object, ``str`` (the mode) for anything else. Both are union
    tags that error paths leave out."""
    return "dict" if isinstance(value, dict) else "str"


def tool_choice_type(named: type[BaseModel]) -> Any:
    """The type of a ``tool_choice`` field: "none", "auto", "required" or a `named` function
    object. An object is checked against `named` alone, so a function choice missing its name
    is an error naming that field (not the modes' "Input should be 'none', ..."), and one of
    another type is refused saying so (`only_function_choices`)."""
    return Annotated[
        Annotated[Literal["none", "auto", "required"], Tag("str")] | Annotated[named, Tag("dict")],
        Discriminator(_choice_kind),
        BeforeValidator(only_function_choices),
    ]


ToolChoice = tool_choice_type(NamedToolChoice)


class CalledFunction(_Strict):
    """A function call of an earlier assistant turn: name and arguments as JSON text.
    parsed_arguments: the arguments as the `openai` SDK's ``chat.completions.parse`` decoded
    them, which its message sent back carries; not read (``arguments`` says the same)."""

    name: StrictStr
    arguments: StrictStr
    parsed_arguments: Any = None


class ToolCallIn(_Strict):
    """One entry of an assistant message's ``tool_calls``."""

    id: StrictStr
    type: Literal["function"] = "function"
    function: CalledFunction
