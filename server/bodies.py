"""Request bodies of the Assistants protocol, validated at the boundary with pydantic.

An unknown field is refused (OpenAI answered "Unrecognized request argument supplied");
the few fields OpenAI knows that cannot apply here are accepted and ignored, so code
written for OpenAI keeps working; docs/serve.md lists them with the reason. What a run
passes to its model beside the history (sampling, reasoning, the tool options, the
answer's format, docs/models.md) is typed here with ``outbox.schemas``' types and becomes
the run's ``ModelOptions``, so a value no model could take is a 400 naming the field.
``metadata`` keeps OpenAI's limits (16 pairs, keys up to 64 characters, values up to 512),
so what runs here runs on OpenAI too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from outbox.schemas import (
    CacheRetention,
    Effort,
    Identifier,
    Includable,
    ModelOptions,
    Reasoning,
    ServiceTier,
    Temperature,
    Tokens,
    TopLogprobs,
    TopP,
    Truncation,
    TruncationStrategy,
    text_format_of,
    tool_choice_of,
)

Ignored = Any  # a field OpenAI knows and we accept without acting on it
MAX_METADATA_PAIRS = 16  # OpenAI's limits on metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def _within_openais_limits(metadata: dict[str, str]) -> dict[str, str]:
    """``metadata`` as OpenAI takes it, else a ValueError worded as OpenAI's."""
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ValueError(
            f"too many properties. Expected an object with at most {MAX_METADATA_PAIRS} "
            f"properties, but got an object with {len(metadata)} properties instead."
        )
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise ValueError(
                f"key {key[:MAX_METADATA_KEY_CHARS]!r}... is too long. Expected a key with "
                f"maximum length {MAX_METADATA_KEY_CHARS}, but got a key with length "
                f"{len(key)} instead."
            )
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(
                f"the value of {key!r} is too long. Expected a string with maximum length "
                f"{MAX_METADATA_VALUE_CHARS}, but got a string with length {len(value)} instead."
            )
    return metadata


Metadata = Annotated[dict[str, str], AfterValidator(_within_openais_limits)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def text_of(content: str | list[dict[str, Any]]) -> str:
    """A message's content as text: a string, or the text of its text parts."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ValueError("only text content parts are supported")
        texts.append(part["text"])
    return "\n".join(texts)


class MessageIn(_Body):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]
    attachments: Ignored = None
    metadata: Metadata | None = None

    @field_validator("content")
    @classmethod
    def _text(cls, value: str | list[dict[str, Any]]) -> str:
        return text_of(value)

    @property
    def text(self) -> str:
        assert isinstance(self.content, str)  # the validator made it text
        return self.content


class _AssistantIgnored(_Body):
    temperature: Ignored = None
    top_p: Ignored = None
    response_format: Ignored = None
    tool_resources: Ignored = None
    reasoning_effort: Ignored = None


class AssistantIn(_AssistantIgnored):
    model: str = Field(min_length=1, max_length=200)
    name: str | None = Field(default=None, max_length=256)
    description: str | None = Field(default=None, max_length=512)
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list, max_length=128)
    metadata: Metadata | None = None


class AssistantChangesIn(_AssistantIgnored):
    """Modify an assistant: only the fields given change."""

    model: str | None = Field(default=None, min_length=1, max_length=200)
    name: str | None = Field(default=None, max_length=256)
    description: str | None = Field(default=None, max_length=512)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    metadata: Metadata | None = None

    def changes(self) -> dict[str, Any]:
        """The fields the caller gave, without the ignored ones."""
        ignored = set(_AssistantIgnored.model_fields)
        return {k: v for k, v in self.model_dump(exclude_unset=True).items() if k not in ignored}


class ThreadChangesIn(_Body):
    metadata: Metadata | None = None
    tool_resources: Ignored = None


class ThreadIn(_Body):
    messages: list[MessageIn] = Field(default_factory=list)
    metadata: Metadata | None = None
    tool_resources: Ignored = None


class _RunOptions(_Body):
    assistant_id: str
    model: str | None = Field(default=None, min_length=1, max_length=200)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    metadata: Metadata | None = None
    stream: bool | None = None
    max_completion_tokens: int | None = Field(default=None, gt=0)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: Any = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_prompt_tokens: Tokens | None = None
    truncation_strategy: TruncationStrategy | None = None
    reasoning_effort: Effort | None = None
    tool_resources: Ignored = None

    @field_validator("tool_choice")
    @classmethod
    def _choice(cls, value: Any) -> Any:
        return None if value is None else tool_choice_of(value)

    @field_validator("response_format")
    @classmethod
    def _format(cls, value: Any) -> Any:
        return None if value in (None, "auto") else text_format_of(value)

    def model_options(self) -> ModelOptions:
        """What the run passes to its model beside the history (chat completions' shapes
        read into the Responses API's terms, as runs keep them)."""
        return ModelOptions(
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            format=self.response_format,
            temperature=self.temperature,
            top_p=self.top_p,
            reasoning=None
            if self.reasoning_effort is None
            else Reasoning(effort=self.reasoning_effort),
            max_output_tokens=self.max_completion_tokens,
            max_prompt_tokens=self.max_prompt_tokens,
            truncation_strategy=self.truncation_strategy,
        )


class RunIn(_RunOptions):
    additional_instructions: str | None = None
    additional_messages: list[MessageIn] | None = None
    include: Ignored = None


class ThreadAndRunIn(_RunOptions):
    thread: ThreadIn | None = None


class ToolOutputIn(_Body):
    tool_call_id: str = Field(min_length=1)
    output: str


class SubmitOutputsIn(_Body):
    tool_outputs: list[ToolOutputIn] = Field(min_length=1)
    stream: bool | None = None


class NoBody(_Body):
    """An endpoint without parameters (cancel): an empty body or ``{}``."""


# -- the Responses protocol ---------------------------------------------------------------


# The fields of a Responses request that are model options under the same name.
RESPONSES_OPTIONS = {
    "temperature",
    "top_p",
    "reasoning",
    "truncation",
    "user",
    "service_tier",
    "include",
    "top_logprobs",
    "max_tool_calls",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "max_output_tokens",
}


class ResponseIn(_Body):
    model: str = Field(min_length=1, max_length=200)
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list, max_length=128)
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool = False
    stream: bool = False
    metadata: Metadata | None = None
    max_output_tokens: int | None = Field(default=None, gt=0)
    store: bool | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    reasoning: Reasoning | None = None
    truncation: Truncation | None = None
    user: Identifier | None = None
    service_tier: ServiceTier | None = None
    include: list[Includable] | None = Field(default=None, max_length=16)
    top_logprobs: TopLogprobs | None = None
    max_tool_calls: Tokens | None = None
    prompt_cache_key: Identifier | None = None
    prompt_cache_retention: CacheRetention | None = None
    safety_identifier: Identifier | None = None

    @field_validator("tool_choice")
    @classmethod
    def _choice(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        choice = ModelOptions(tool_choice=tool_choice_of(value))
        tools = info.data.get("tools") or []
        choice.check_tools([t.get("name") for t in tools if isinstance(t.get("name"), str)])
        return choice.tool_choice

    @field_validator("text")
    @classmethod
    def _text(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        unknown = sorted(set(value) - {"format", "verbosity"})
        if unknown:
            raise ValueError(
                f"'text' takes 'format' and 'verbosity', not {', '.join(map(repr, unknown))}"
            )
        try:
            return ModelOptions(**value).model_dump(exclude_none=True)
        except ValidationError as err:
            first = err.errors()[0]
            message = str(first["msg"]).removeprefix("Value error, ")
            raise ValueError(f"text.{first['loc'][0]}: {message}") from None

    def model_options(self) -> ModelOptions:
        """What the request asks its model turns to pass on beside the history."""
        return ModelOptions(
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            **(self.text or {}),
            **self.model_dump(include=RESPONSES_OPTIONS, exclude_none=True),
        )

    @field_validator("store")
    @classmethod
    def _stored(cls, value: bool | None) -> bool | None:
        if value is False:
            raise ValueError(
                "outbox serve stores every response (store=false is not supported): the "
                "outbox is the record. For the same effect send the whole history in "
                "'input' each time (no previous_response_id), and delete a response you "
                "do not want listed with DELETE /v1/responses/{id}"
            )
        return value


class ConversationIn(_Body):
    items: list[dict[str, Any]] = Field(default_factory=list, max_length=20)
    metadata: Metadata | None = None


class ConversationChangesIn(_Body):
    metadata: Metadata


class ItemsIn(_Body):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=20)
