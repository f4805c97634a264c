"""Agent definitions: `config.yaml` (or `agent.yaml`) plus `system_prompt.md` (or `.txt`).

Tools are external commands, in one of three forms that all expand to a `Tool`:

    command: [argv...] + parameters (inject_as argument | option | stdin)
    exec:  "ls -la ${dir}"          argv, no shell; placeholders substituted in place
    shell: "cat ${file} | wc -l"    sh -c; values passed as positional parameters, never spliced
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from deltad.protocol.errors import UnsafeFile
from deltad.protocol.fsio import read_regular_text

from .errors import ConfigError

CONFIG_NAMES = ("config.yaml", "agent.yaml")
PROMPT_NAMES = ("system_prompt.md", "system_prompt.txt")
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SHELL_OPERATORS = {"|", "||", "&", "&&", ";", ">", ">>", "<", "<<", "`"}
BUILTIN_TOOLS = {"ask_human"}
MAX_CONFIG_BYTES = 1024 * 1024

ParamType = Literal["string", "integer", "number", "boolean"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParameterSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: ParamType = "string"
    description: str = ""
    inject_as: Literal["argument", "stdin", "option"] = "argument"
    option_name: str | None = None
    required: bool = True

    @model_validator(mode="after")
    def _option_needs_name(self) -> ParameterSpec:
        if self.inject_as == "option" and not self.option_name:
            raise ValueError("inject_as: option needs option_name")
        return self


class ToolSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    command: list[str] | None = Field(default=None, min_length=1)
    exec: str | None = None
    shell: str | None = None
    stdin: str | None = None  # shorthand forms: which parameter feeds stdin
    parameters: list[ParameterSpec] = []
    timeout_seconds: float | None = Field(default=None, gt=0)
    approval: Literal["required", "never"] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ToolSpec:
        forms = [f for f in ("command", "exec", "shell") if getattr(self, f) is not None]
        if len(forms) != 1:
            raise ValueError("give exactly one of command, exec or shell")
        if self.name in BUILTIN_TOOLS:
            raise ValueError(f"{self.name} is built in; remove it from tools")
        return self


class LLMSettings(_Strict):
    model: str
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, gt=0)
    max_retries: int = Field(default=3, ge=0, le=20)
    timeout_seconds: float = Field(default=120, gt=0)


class ApprovalPolicy(_Strict):
    """Which tool calls wait for a human. Patterns are fnmatch-style tool names."""

    default: Literal["required", "never"] = "never"
    require: list[str] = []
    exempt: list[str] = []
    timeout_seconds: float | None = Field(default=None, gt=0)  # then rejected


class AgentConfig(_Strict):
    name: str
    description: str = ""
    version: str | None = None
    llm: LLMSettings
    tools: list[ToolSpec] = []
    max_iterations: int = Field(default=30, gt=0)
    tool_timeout_seconds: float = Field(default=120, gt=0)
    approval: ApprovalPolicy | None = None


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    stdin: str | None
    env: dict[str, str]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: list[ParameterSpec]
    timeout_seconds: float
    form: Literal["command", "exec", "shell"]
    template: list[str]  # command argv, exec tokens, or ["sh", "-c", script]
    shell_order: list[str]  # shell form: parameter names in $1.. order
    approval: Literal["required", "never"] | None = None

    def schema(self) -> dict[str, Any]:
        props = {
            p.name: {"type": p.type, **({"description": p.description} if p.description else {})}
            for p in self.parameters
        }
        required = [p.name for p in self.parameters if p.required]
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description or f"Runs: {' '.join(self.template)}",
                "parameters": {"type": "object", "properties": props, "required": required},
            },
        }

    def check_args(self, args: Any) -> dict[str, str]:
        """Validate the model's arguments; returns them as strings for argv. Raises ValueError."""
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
        known = {p.name for p in self.parameters}
        if unknown := sorted(set(args) - known):
            raise ValueError(f"unknown argument(s): {', '.join(unknown)}")
        out: dict[str, str] = {}
        for p in self.parameters:
            if p.name not in args or args[p.name] is None:
                if p.required:
                    raise ValueError(f"missing required argument: {p.name}")
                continue
            out[p.name] = _coerce(p, args[p.name])
        return out

    def invocation(self, values: dict[str, str], agent_home: Path) -> Invocation:
        env = {"AGENT_HOME": str(agent_home)}
        home = str(agent_home)
        stdin = next(
            (
                values[p.name]
                for p in self.parameters
                if p.inject_as == "stdin" and p.name in values
            ),
            None,
        )
        if self.form == "shell":
            # ${AGENT_HOME} stays for sh to expand from the environment.
            argv = [*self.template, "sh", *(values.get(n, "") for n in self.shell_order)]
            return Invocation(argv, stdin, env)
        argv = [_substitute(t, values, home) for t in self.template]
        if self.form == "command":
            for p in self.parameters:
                if p.name not in values or p.inject_as == "stdin":
                    continue
                if p.inject_as == "option":
                    argv.append(p.option_name or "")
                argv.append(values[p.name])
        return Invocation(argv, stdin, env)


def _coerce(p: ParameterSpec, value: Any) -> str:
    if p.type == "boolean":
        if isinstance(value, bool):
            return "true" if value else "false"
        if str(value).lower() in ("true", "false"):
            return str(value).lower()
        raise ValueError(f"{p.name} must be a boolean")
    if p.type in ("integer", "number"):
        try:
            number = int(value) if p.type == "integer" else float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{p.name} must be an {p.type}") from None
        if isinstance(value, bool) or (p.type == "integer" and float(value) != number):
            raise ValueError(f"{p.name} must be an {p.type}")
        return str(value)
    if isinstance(value, dict | list):
        raise ValueError(f"{p.name} must be a string")
    return str(value)


def _substitute(token: str, values: dict[str, str], home: str) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        return home if name == "AGENT_HOME" else values.get(name, "")

    return PLACEHOLDER.sub(repl, token)


def _placeholders(text: str) -> list[str]:
    seen: list[str] = []
    for name in PLACEHOLDER.findall(text):
        if name != "AGENT_HOME" and name not in seen:
            seen.append(name)
    return seen


def _merge_params(spec: ToolSpec, inferred: list[str]) -> list[ParameterSpec]:
    explicit = {p.name: p for p in spec.parameters}
    params = [explicit.get(n, ParameterSpec(name=n)) for n in inferred]
    if spec.stdin:
        params.append(
            explicit.get(spec.stdin, ParameterSpec(name=spec.stdin)).model_copy(
                update={"inject_as": "stdin"}
            )
        )
    names = {p.name for p in params}
    if extra := sorted(set(explicit) - names):
        raise ValueError(f"parameters not used in the template: {', '.join(extra)}")
    for p in params:
        if p.inject_as == "option" or (p.inject_as == "stdin" and p.name != spec.stdin):
            raise ValueError(f"parameter {p.name}: inject_as is fixed by the template")
    return params


def expand_tool(spec: ToolSpec, default_timeout: float) -> Tool:
    timeout = spec.timeout_seconds or default_timeout
    if spec.command is not None:
        if sum(p.inject_as == "stdin" for p in spec.parameters) > 1:
            raise ValueError("at most one parameter may use inject_as: stdin")
        return Tool(
            spec.name, spec.description, spec.parameters, timeout, "command", spec.command, []
        )
    if spec.exec is not None:
        try:
            tokens = shlex.split(spec.exec)
        except ValueError as e:
            raise ValueError(f"exec: {e}") from None
        if bad := [t for t in tokens if t in SHELL_OPERATORS or "$(" in t or "`" in t]:
            raise ValueError(f"exec: {bad[0]!r} needs a shell; use shell: instead")
        if not tokens:
            raise ValueError("exec: is empty")
        params = _merge_params(spec, _placeholders(spec.exec))
        return Tool(spec.name, spec.description, params, timeout, "exec", tokens, [])
    script = spec.shell or ""
    order = _placeholders(script)
    for i, name in enumerate(order, 1):
        # Quote positionally; "${x}" written in double quotes stays one word too.
        script = script.replace(f'"${{{name}}}"', f'"${i}"').replace(f"${{{name}}}", f'"${i}"')
    params = _merge_params(spec, order)
    return Tool(spec.name, spec.description, params, timeout, "shell", ["sh", "-c", script], order)


@dataclass(frozen=True)
class Agent:
    home: Path
    config_file: Path
    prompt_file: Path
    config: AgentConfig
    system_prompt: str
    tools: dict[str, Tool]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def has_policy(self) -> bool:
        return self.config.approval is not None or any(t.approval for t in self.tools.values())

    def needs_approval(self, tool_name: str) -> bool:
        """With no policy nothing is gated. With one, a call is gated unless the tool says
        `never`, an `exempt` pattern matches, or the default is `never`; an explicit
        `required` or a `require` pattern always wins over `exempt`."""
        if not self.has_policy:
            return False
        tool = self.tools.get(tool_name)
        if tool is not None and tool.approval is not None:
            return tool.approval == "required"
        policy = self.config.approval or ApprovalPolicy()
        if any(fnmatch.fnmatchcase(tool_name, p) for p in policy.require):
            return True
        if any(fnmatch.fnmatchcase(tool_name, p) for p in policy.exempt):
            return False
        return policy.default == "required"


def _find(home: Path, names: tuple[str, ...], what: str) -> Path:
    for name in names:
        if (home / name).is_file():
            return home / name
    raise ConfigError(f"{home}: no {what} ({' or '.join(names)})")


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _read(path: Path) -> str:
    """An agent file: regular (a FIFO must not hang us), capped, UTF-8; symlinks are fine."""
    try:
        return read_regular_text(path, MAX_CONFIG_BYTES, follow=True)
    except (UnsafeFile, OSError) as e:
        raise ConfigError(f"{path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None


def load_agent(path: str | Path) -> Agent:
    home = Path(path).expanduser().absolute()
    if home.is_file() and home.name in CONFIG_NAMES:
        home = home.parent
    if not home.is_dir():
        raise ConfigError(f"agent directory not found: {home}")
    config_file = _find(home, CONFIG_NAMES, "agent config")
    prompt_file = _find(home, PROMPT_NAMES, "system prompt")
    try:
        raw = yaml.safe_load(_read(config_file))
    except (yaml.YAMLError, RecursionError) as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        at = f" (line {line + 1})" if line is not None else ""
        raise ConfigError(f"{config_file}{at}: not valid YAML") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{config_file}: expected a mapping at the top level")
    try:
        config = AgentConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{config_file}: {_where(err['loc'])}: {msg}") from None
    tools: dict[str, Tool] = {}
    for i, spec in enumerate(config.tools):
        if spec.name in tools:
            raise ConfigError(f"{config_file}: tools[{i}].name: duplicate tool {spec.name!r}")
        try:
            tools[spec.name] = replace(
                expand_tool(spec, config.tool_timeout_seconds), approval=spec.approval
            )
        except ValueError as e:
            raise ConfigError(f"{config_file}: tools[{i}] ({spec.name}): {e}") from None
    _check_patterns(config_file, config.approval, tools)
    prompt = _read(prompt_file).strip()
    if not prompt:
        raise ConfigError(f"{prompt_file}: the system prompt is empty")
    return Agent(home, config_file, prompt_file, config, prompt, tools)


def _check_patterns(config_file: Path, policy: ApprovalPolicy | None, tools: dict) -> None:
    """A pattern that names no tool is a typo, and a typo must not leave a tool ungated."""
    if policy is None:
        return
    for key in ("require", "exempt"):
        for i, pattern in enumerate(getattr(policy, key)):
            if not any(fnmatch.fnmatchcase(name, pattern) for name in tools):
                raise ConfigError(
                    f"{config_file}: approval.{key}[{i}]: {pattern!r} matches no tool "
                    f"(tools: {', '.join(tools) or 'none'})"
                )
