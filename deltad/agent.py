"""Agent definitions: `config.yaml` (or `agent.yaml`) plus `system_prompt.md` (or `.txt`).

Tools are external commands, in one of three forms that all expand to a `Tool`:

    command: [argv...] + parameters (inject_as argument | option | stdin | env | fd)
    exec:  "ls -la ${dir}"          argv, no shell; placeholders substituted in place
    shell: "cat ${file} | wc -l"    sh -c; values passed as environment variables, never spliced

A value reaches a tool in argv only where the definition puts it there; argv is readable by
every user of the machine (/proc/PID/cmdline), so a secret (a `${secret:ID}` handle) may go
through `env`, `stdin`, `fd` or a shell tool, and into argv only when the tool says
`secrets_in_argv: true`.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from deltad.protocol.errors import UnsafeFile
from deltad.protocol.followup import FollowUp
from deltad.protocol.fsio import read_regular_text
from deltad.protocol.models import MAX_APPROVALS, InteractionRequest, respondent_problem
from deltad.protocol.replies import AnswerRejected, Decision, Reply

from .errors import ConfigError

CONFIG_NAMES = ("config.yaml", "agent.yaml")
PROMPT_NAMES = ("system_prompt.md", "system_prompt.txt")
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SHELL_OPERATORS = {"|", "||", "&", "&&", ";", ">", ">>", "<", "<<", "`"}
BUILTIN_TOOLS = {"ask_human"}
MAX_CONFIG_BYTES = 1024 * 1024

ParamType = Literal["string", "integer", "number", "boolean"]
Form = Literal["command", "exec", "shell"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParameterSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: ParamType = "string"
    description: str = ""
    inject_as: Literal["argument", "stdin", "option", "env", "fd"] = "argument"
    option_name: str | None = None
    env_name: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    required: bool = True

    @model_validator(mode="after")
    def _option_needs_name(self) -> ParameterSpec:
        if self.inject_as == "option" and not self.option_name:
            raise ValueError("inject_as: option needs option_name")
        if self.env_name and self.inject_as != "env":
            raise ValueError("env_name is only for inject_as: env")
        return self

    @property
    def in_argv(self) -> bool:
        return self.inject_as in ("argument", "option")

    @property
    def variable(self) -> str:
        """The environment variable an `env` parameter (or any shell-tool value) arrives in."""
        return self.env_name or self.name


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
    secrets_in_argv: bool = False  # explicit opt-in: other users can read argv
    network: bool | None = None  # None: the agent's sandbox.network

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
    timeout_seconds: float = Field(default=120, gt=0)  # one attempt
    total_timeout_seconds: float = Field(default=300, gt=0)  # all attempts and waits together
    # The context budget (engine/budget.py): the model's window in tokens (default: known for
    # its name, else 32,768) and the tokens one call's messages may take (default: the window
    # less max_tokens and the tools' schemas). Older turns beyond it are left out, on record.
    context_window: int | None = Field(default=None, gt=0)
    context_budget: int | None = Field(default=None, gt=0)
    # Sent as `reasoning_effort` when set (a pipeline node's own setting overrides it).
    reasoning_effort: Literal["low", "medium", "high"] | None = None


class ProviderSettings(_Strict):
    """An OpenAI-compatible endpoint a pipeline node's `llm_provider` names."""

    base_url: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class ApprovalPolicy(_Strict):
    """Which tool calls wait for a human. Patterns are fnmatch-style tool names."""

    default: Literal["required", "never"] = "never"
    require: list[str] = []
    exempt: list[str] = []
    timeout_seconds: float | None = Field(default=None, gt=0)  # then rejected
    # Who may decide over HTTP (token names, group:NAME); written into each approval request.
    respondents: list[str] = []
    # Four eyes (docs/inbox.md): this many distinct respondents must approve before a call
    # runs; `owner_may_approve: false` refuses the workspace owner's own approval.
    approvals_required: int = Field(default=1, ge=1, le=MAX_APPROVALS)
    owner_may_approve: bool = True

    @field_validator("respondents")
    @classmethod
    def _respondents(cls, names: list[str]) -> list[str]:
        for n in names:
            if (why := respondent_problem(n)) is not None:
                raise ValueError(why)
        return names

    @property
    def gated(self) -> bool:
        """Do its approvals count only when the daemon signed them (protocol/seal.py)?"""
        return bool(self.respondents) or self.approvals_required > 1 or not self.owner_may_approve


class SandboxPolicy(_Strict):
    """How the agent's tools are confined (engine/sandbox.py, docs/delta.md "Tools run
    sandboxed"): the workspace writable, its `.delta/` and the agent's directory read-only,
    the rest of the filesystem read-only but for `writable`, a private /tmp, nothing left
    running after a call. `unavailable` is the operator's choice where that cannot be had."""

    unavailable: Literal["refuse", "unsandboxed"] = "refuse"
    writable: list[str] = []  # absolute paths the tools may also write
    network: bool = True  # the default of every tool's `network:`

    @field_validator("writable")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        for p in paths:
            if not p.startswith("/"):
                raise ValueError(f"{p!r} is not an absolute path")
        return paths


class AgentConfig(_Strict):
    name: str
    description: str = ""
    version: str | None = None
    llm: LLMSettings
    tools: list[ToolSpec] = []
    max_iterations: int = Field(default=30, gt=0)
    tool_timeout_seconds: float = Field(default=120, gt=0)
    approval: ApprovalPolicy | None = None
    providers: dict[str, ProviderSettings] = {}  # llm_provider name -> endpoint
    # Reminders, escalation and the SLA clock of every question this agent asks (an
    # ask_human call's own arguments win; the daemon's `follow_up:` fills what is unset).
    follow_up: FollowUp | None = None
    sandbox: SandboxPolicy = SandboxPolicy()


# Stands for an inherited pipe's /dev/fd/N in argv until the tool is started.
FD_MARK = "\0fd:"


def fd_token(name: str) -> str:
    return f"{FD_MARK}{name}\0"


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    stdin: str | None
    env: dict[str, str]
    fds: dict[str, str] = field(default_factory=dict)  # parameter -> value read from a pipe

    def display(self) -> str:
        """The command line as shown to people and recorded (fd values as their names)."""
        return shlex.join(re.sub(r"\0fd:([A-Za-z0-9_]+)\0", r"/dev/fd/<\1>", a) for a in self.argv)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: list[ParameterSpec]
    timeout_seconds: float
    form: Form
    template: list[str]  # command argv, exec tokens, or ["sh", "-c", script]
    approval: Literal["required", "never"] | None = None
    secrets_in_argv: bool = False
    network: bool | None = None  # None: the agent's sandbox.network

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
        home = str(agent_home)
        env = {"AGENT_HOME": home}
        stdin, fds = None, {}
        argv_params = {}
        for p in self.parameters:
            if p.name not in values:
                continue
            if p.inject_as == "stdin":
                stdin = values[p.name]
            elif p.inject_as == "env" or self.form == "shell":
                env[p.variable] = values[p.name]
            elif p.inject_as == "fd":
                fds[p.name] = values[p.name]
                argv_params[p.name] = fd_token(p.name)
            else:
                argv_params[p.name] = values[p.name]
        if self.form == "shell":
            return Invocation(list(self.template), stdin, env)
        argv = [_substitute(t, argv_params, home) for t in self.template]
        if self.form == "command":
            for p in self.parameters:
                if p.name in argv_params:
                    if p.inject_as == "option":
                        argv.append(p.option_name or "")
                    argv.append(argv_params[p.name])
        return Invocation(argv, stdin, env, fds)

    def argv_parameters(self) -> list[str]:
        """Parameters whose value ends up in argv (where a secret must not go)."""
        if self.form == "shell":
            return []
        return [p.name for p in self.parameters if p.in_argv]


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


def _merge_params(spec: ToolSpec, inferred: list[str], *, shell: bool) -> list[ParameterSpec]:
    """The template's placeholders (in order), refined by explicit `parameters`; extra explicit
    parameters may only arrive outside the template (stdin, env)."""
    explicit = {p.name: p for p in spec.parameters}
    params = [explicit.get(n, ParameterSpec(name=n)) for n in inferred]
    for p in params:
        allowed = ("argument", "env") if shell else ("argument", "fd")
        if p.inject_as not in allowed:
            raise ValueError(
                f"parameter {p.name}: inject_as {p.inject_as} does not fit ${{{p.name}}}"
            )
    names = {p.name for p in params}
    for p in spec.parameters:
        if p.name not in names and p.inject_as in ("env", "stdin"):
            params.append(p)
            names.add(p.name)
    if spec.stdin:
        base = explicit.get(spec.stdin, ParameterSpec(name=spec.stdin))
        params = [q for q in params if q.name != spec.stdin]
        params.append(base.model_copy(update={"inject_as": "stdin"}))
        names.add(spec.stdin)
    if extra := sorted(set(explicit) - names):
        raise ValueError(f"parameters not used in the template: {', '.join(extra)}")
    if sum(p.inject_as == "stdin" for p in params) > 1:
        raise ValueError("at most one parameter may use inject_as: stdin")
    return params


def _single_quoted(script: str) -> list[str]:
    """Placeholders inside single quotes: sh would never expand the value put there."""
    found, quoted, i = [], False, 0
    while i < len(script):
        c = script[i]
        if c == "\\" and not quoted:
            i += 2
            continue
        if c == "'":
            quoted = not quoted
        elif quoted and (m := PLACEHOLDER.match(script, i)):
            found.append(m.group(1))
        i += 1
    return found


def expand_tool(spec: ToolSpec, default_timeout: float) -> Tool:
    timeout = spec.timeout_seconds or default_timeout

    def tool(form: Form, params: list[ParameterSpec], t: list[str]) -> Tool:
        return Tool(
            spec.name,
            spec.description,
            params,
            timeout,
            form,
            t,
            spec.approval,
            spec.secrets_in_argv,
            spec.network,
        )

    if spec.command is not None:
        if sum(p.inject_as == "stdin" for p in spec.parameters) > 1:
            raise ValueError("at most one parameter may use inject_as: stdin")
        return tool("command", spec.parameters, spec.command)
    if spec.exec is not None:
        if "${" in PLACEHOLDER.sub("", spec.exec):
            raise ValueError(f"exec: an unfinished placeholder in {spec.exec!r} (write ${{name}})")
        try:
            tokens = shlex.split(spec.exec)
        except ValueError as e:
            raise ValueError(f"exec: {e}") from None
        if bad := [t for t in tokens if t in SHELL_OPERATORS or "$(" in t or "`" in t]:
            raise ValueError(f"exec: {bad[0]!r} needs a shell; use shell: instead")
        if not tokens:
            raise ValueError("exec: is empty")
        return tool("exec", _merge_params(spec, _placeholders(spec.exec), shell=False), tokens)
    script = spec.shell or ""
    if quoted := _single_quoted(script):
        raise ValueError(
            f"shell: ${{{quoted[0]}}} is inside single quotes, where sh never expands it; "
            f'use double quotes ("${{{quoted[0]}}}") or none'
        )
    if "${" in PLACEHOLDER.sub("", script.replace("${AGENT_HOME}", "")):
        raise ValueError("shell: an unfinished placeholder (write ${name})")
    params = _merge_params(spec, _placeholders(script), shell=True)
    for p in params:
        # Quote as one word; "${x}" written in double quotes stays one word too. The value
        # comes from the environment, so it is never spliced into the script.
        var = p.variable
        script = script.replace(f'"${{{p.name}}}"', f'"${{{var}}}"').replace(
            f"${{{p.name}}}", f'"${{{var}}}"'
        )
    return tool("shell", params, ["sh", "-c", script])


@dataclass(frozen=True)
class Agent:
    home: Path
    config_file: Path
    prompt_file: Path
    config: AgentConfig
    system_prompt: str
    tools: dict[str, Tool]
    notes: list[str] = field(default_factory=list)  # things a person should know (to stderr)

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


# libyaml's loader where PyYAML has it (its wheels do): the same safe constructor, parsed in C,
# ~0.5 ms less on every resume's path; its nesting is capped (an error, not a crash).
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_agent(path: str | Path) -> Agent:
    home = Path(path).expanduser().absolute()
    if home.is_file() and home.name in CONFIG_NAMES:
        home = home.parent
    if not home.is_dir():
        raise ConfigError(f"agent directory not found: {home}")
    config_file = _find(home, CONFIG_NAMES, "agent config")
    prompt_file = _find(home, PROMPT_NAMES, "system prompt")
    try:
        raw = yaml.load(_read(config_file), Loader=YAML_LOADER)
    except (yaml.YAMLError, RecursionError) as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        at = f" (line {line + 1})" if line is not None else ""
        why = getattr(e, "problem", None) or (
            "nested too deeply" if isinstance(e, RecursionError) else "syntax error"
        )
        raise ConfigError(f"{config_file}{at}: not valid YAML: {why}") from None
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
            tools[spec.name] = expand_tool(spec, config.tool_timeout_seconds)
        except ValueError as e:
            raise ConfigError(f"{config_file}: tools[{i}] ({spec.name}): {e}") from None
    _check_patterns(config_file, config.approval, tools)
    prompt = _read(prompt_file).strip()
    if not prompt:
        raise ConfigError(f"{prompt_file}: the system prompt is empty")
    notes = []
    if len(present := [n for n in CONFIG_NAMES if (home / n).is_file()]) > 1:
        notes.append(f"{home} has both {' and '.join(present)}; using {config_file.name}")
    return Agent(home, config_file, prompt_file, config, prompt, tools, notes)


def _check_patterns(
    config_file: Path, policy: ApprovalPolicy | None, tools: dict[str, Tool]
) -> None:
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


def check_edits(agent: Agent, req: InteractionRequest, reply: Reply) -> None:
    """Edited arguments must fit the tool's schema before anything runs. The one check beyond
    the question's kind that an answer must pass: the engine makes it before using a reply,
    and the answering package before writing one (so `delta respond` and HTTP refuse alike)."""
    for d in reply.decisions:
        if d.decision != Decision.EDIT:
            continue
        call = next((c for c in req.calls if c.action_id == d.action_id), None)
        tool = agent.tools.get(call.tool_name) if call else None
        if tool is None:
            raise AnswerRejected(f"edit of {d.action_id!r}: no such gated call")
        try:
            tool.check_args(d.arguments)
        except ValueError as e:
            raise AnswerRejected(f"edit of {d.action_id!r} ({tool.name}): {e}") from None
