"""Which LLM to use, decided from flags, environment and config files.

Precedence, per setting: explicit ``LLMConfig`` (the CLI's flags) > environment
(``KSCOUT_*`` and the provider's own key variable) > ``./kscout.toml`` >
``~/.config/kscout/config.toml`` (``$XDG_CONFIG_HOME`` respected) > defaults.

Nothing is enabled by an API key alone: a provider (or a model or base URL it
can be inferred from) must be chosen somewhere, because an LLM run spends
money and an exported ``ANTHROPIC_API_KEY`` may be there for something else.
When nothing is chosen, :func:`resolve_llm_config` returns None and callers
fall back to their offline policies.

A source that names a provider owns its model, base URL and key: if a flag
switches the provider to ``anthropic``, the ``base_url`` that ``kscout.toml``
set for its ``openai-compatible`` server is not sent to Anthropic.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from .llm_pricing import ModelPrice

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Provider = Literal["anthropic", "openai", "openai-compatible"]
PROVIDERS: tuple[str, ...] = get_args(Provider)

DEFAULT_MODELS: dict[str, str] = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5-mini"}
# openai-compatible has its own variable so an OpenAI key is never sent to a third-party host.
KEY_ENV: dict[str, str] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
    "openai-compatible": "KSCOUT_API_KEY",
}
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MAX_ATTEMPTS = 5

ENV_PROVIDER = "KSCOUT_PROVIDER"
ENV_MODEL = "KSCOUT_MODEL"
ENV_BASE_URL = "KSCOUT_BASE_URL"
ENV_MAX_USD = "KSCOUT_LLM_MAX_USD"
ENV_MAX_TOKENS = "KSCOUT_LLM_MAX_TOKENS"

_BOUND_TO_PROVIDER = ("model", "base_url", "api_key")
_SCALARS = ("timeout_s", "max_attempts", "max_usd", "max_tokens_total")


class LLMConfigError(ValueError):
    """The LLM setup cannot work as configured; the message says what to set or fix."""


class LLMConfig(BaseModel):
    """One source's LLM settings; None means "not set here, ask the next source"."""

    model_config = ConfigDict(extra="forbid")

    provider: Provider | None = None
    model: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float | None = Field(default=None, gt=0, description="per-request client timeout")
    max_attempts: int | None = Field(default=None, ge=1, description="tries per call, retries included")
    max_usd: float | None = Field(default=None, ge=0, description="per-run spending cap")
    max_tokens_total: int | None = Field(default=None, ge=0, description="per-run token cap")
    prices: dict[str, ModelPrice] | None = Field(default=None, description="USD per million tokens, by model")


class ResolvedLLMConfig(BaseModel):
    """The merged settings plus, for error messages, where each one came from."""

    provider: Provider
    model: str
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_usd: float | None = None
    max_tokens_total: int | None = None
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    sources: dict[str, str] = Field(default_factory=dict, description="setting -> where it came from")


def default_config_files(cwd: Path | None = None, env: Mapping[str, str] | None = None) -> list[Path]:
    """Project file first (it is more specific), then the user's."""
    env = os.environ if env is None else env
    config_home = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return [(cwd or Path.cwd()) / "kscout.toml", config_home / "kscout" / "config.toml"]


CONFIG_SECTIONS = ("llm", "search")
"""The sections of kscout.toml: `[llm]` read here, `[search]` in search_config.py. Each reader checks the
whole file, so a misspelt `[serch]` is an error whichever reads the file first, not a table nobody reads."""


def read_config_file(path: Path, error: type[ValueError]) -> dict[str, Any]:
    """A config file's sections ({} when there is no file); `error` when it cannot be read or holds
    something no reader would look at."""
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        where = _quoted_line(text, str(exc)) if isinstance(exc, tomllib.TOMLDecodeError) else ""
        raise error(f"cannot read {path}: {exc}{where}") from exc
    for name, value in data.items():
        if name not in CONFIG_SECTIONS:
            raise error(_unknown_section(path, name, value))
    return data


def _quoted_line(text: str, message: str) -> str:
    """The line a TOML error points at, quoted: tomllib's words can mislead (`[search` without its `]`, after a
    `[search]`, reads "Cannot declare ('search',) twice"), the line itself does not."""
    found = re.search(r"at line (\d+)", message)
    lines = text.splitlines()
    if not found or not 0 < int(found.group(1)) <= len(lines):
        return ""
    line = lines[int(found.group(1)) - 1].strip()
    hint = "; a section header needs its closing ]" if line.startswith("[") and not line.split("#")[0].rstrip().endswith("]") else ""
    return f": `{line}`{hint}"


def _unknown_section(path: Path, name: str, value: Any) -> str:
    known = [f"[{s}]" for s in CONFIG_SECTIONS]
    if not isinstance(value, dict):
        return f"{name} in {path} is outside any section; put it under {' or '.join(known)}"
    close = difflib.get_close_matches(name, CONFIG_SECTIONS, n=1)
    guess = f" (did you mean [{close[0]}]?)" if close else ""
    return f"unknown section [{name}] in {path}{guess}; kscout reads only {' and '.join(known)}"


def load_config_file(path: Path) -> LLMConfig | None:
    """The [llm] section of a TOML file, or None if the file or section is absent."""
    section = read_config_file(path, LLMConfigError).get("llm")
    if section is None:
        return None
    try:
        return LLMConfig.model_validate(section)
    except ValidationError as exc:
        raise LLMConfigError(f"invalid [llm] section in {path}: {_brief(exc)}") from exc


def config_from_env(env: Mapping[str, str]) -> LLMConfig:
    """The KSCOUT_* variables; empty values count as unset."""
    raw: dict[str, Any] = {
        "provider": env.get(ENV_PROVIDER) or None,
        "model": env.get(ENV_MODEL) or None,
        "base_url": env.get(ENV_BASE_URL) or None,
        "max_usd": env.get(ENV_MAX_USD) or None,
        "max_tokens_total": env.get(ENV_MAX_TOKENS) or None,
    }
    try:
        return LLMConfig.model_validate(raw)
    except ValidationError as exc:
        names = {"provider": ENV_PROVIDER, "model": ENV_MODEL, "base_url": ENV_BASE_URL,
                 "max_usd": ENV_MAX_USD, "max_tokens_total": ENV_MAX_TOKENS}
        bad = ", ".join(f"{names.get(str(e['loc'][0]), e['loc'][0])}: {e['msg']}" for e in exc.errors())
        raise LLMConfigError(f"invalid environment setting ({bad}); providers are {', '.join(PROVIDERS)}") from exc


def _infer_provider(model: str | None, base_url: str | None) -> Provider | None:
    if base_url:
        return "openai-compatible"
    if model:
        name = model.lower().rsplit("/", 1)[-1]
        if name.startswith("claude"):
            return "anthropic"
        if name.startswith(("gpt-", "chatgpt", "o1", "o3", "o4")):
            return "openai"
        raise LLMConfigError(
            f"model {model!r} is set but no provider: set {ENV_PROVIDER} (or --provider)"
            f" to one of {', '.join(PROVIDERS)}"
        )
    return None


def resolve_llm_config(
    explicit: LLMConfig | None = None,
    *,
    env: Mapping[str, str] | None = None,
    config_files: Sequence[Path] | None = None,
) -> ResolvedLLMConfig | None:
    """Merge all sources; None when no LLM was asked for anywhere."""
    env = os.environ if env is None else env
    files = default_config_files(env=env) if config_files is None else config_files
    sources: list[tuple[str, LLMConfig]] = []
    if explicit is not None:
        sources.append(("flag", explicit))
    sources.append(("environment", config_from_env(env)))
    for path in files:
        loaded = load_config_file(Path(path))
        if loaded is not None:
            sources.append((str(path), loaded))

    where: dict[str, str] = {}
    provider: Provider | None = next((cfg.provider for _, cfg in sources if cfg.provider), None)
    if provider:
        where["provider"] = next(label for label, cfg in sources if cfg.provider)

    def pick(field: str) -> Any:
        for label, cfg in sources:
            if field in _BOUND_TO_PROVIDER and provider and cfg.provider and cfg.provider != provider:
                continue  # that source configured a different provider
            value = getattr(cfg, field)
            if value is not None:
                where[field] = label
                return value
        return None

    model, base_url = pick("model"), pick("base_url")
    if provider is None:
        provider = _infer_provider(model, base_url)
        if provider is None:
            return None
        where["provider"] = f"inferred from {'base_url' if base_url else 'model'}"

    api_key = _pick_key(sources, provider, env, where)
    if model is None:
        if provider not in DEFAULT_MODELS:
            raise LLMConfigError(
                f"provider {provider} needs a model name (the one the server serves): set {ENV_MODEL}, or model in the [llm] "
                "section of kscout.toml (`kscout chat` and `kscout predict` also take --model)"
            )
        model, where["model"] = DEFAULT_MODELS[provider], "default"
    if provider == "openai-compatible" and not base_url:
        raise LLMConfigError(
            f"provider openai-compatible needs the server's URL: set {ENV_BASE_URL}, or base_url in the [llm] section of "
            "kscout.toml (`kscout chat` and `kscout predict` also take --base-url),"
            " e.g. http://localhost:8000/v1 for vLLM or http://localhost:11434/v1 for Ollama"
        )
    if provider in ("anthropic", "openai") and api_key is None:
        raise LLMConfigError(
            f"provider {provider} ({_said(where['provider'])}) needs an API key: set {KEY_ENV[provider]},"
            " put api_key in the [llm] section of kscout.toml, or choose another provider with KSCOUT_PROVIDER (or the --provider"
            " of kscout chat and kscout predict)"
        )

    prices: dict[str, ModelPrice] = {}
    for _, cfg in reversed(sources):  # lowest precedence first, so higher ones overwrite
        prices.update(cfg.prices or {})
    scalars = {field: pick(field) for field in _SCALARS}
    return ResolvedLLMConfig(
        provider=provider,
        model=model,
        base_url=base_url,
        api_key=api_key,
        prices=prices,
        sources=where,
        **{k: v for k, v in scalars.items() if v is not None},
    )


def _said(source: str) -> str:
    """Where a setting came from, as a phrase: "inferred from model" stands alone, a source is "from" it."""
    return source if source.startswith("inferred") else f"from {source}"


def _pick_key(
    sources: list[tuple[str, LLMConfig]], provider: str, env: Mapping[str, str], where: dict[str, str]
) -> SecretStr | None:
    """flag > the provider's key variable > config file, like every other setting."""
    candidates: list[tuple[str, SecretStr | None]] = []
    for label, cfg in sources:
        if cfg.provider and cfg.provider != provider:
            continue
        if label == "environment":
            value = env.get(KEY_ENV[provider]) or None
            candidates.append((KEY_ENV[provider], SecretStr(value) if value else None))
        else:
            candidates.append((label, cfg.api_key))
    for label, key in candidates:
        if key is not None and key.get_secret_value():
            where["api_key"] = label
            return key
    return None


def describe_how_to_enable() -> str:
    """What to tell a user whose run is going offline because no LLM is configured."""
    return (
        "No LLM is configured, so kernelscout uses its offline policies. To enable one, set:\n"
        f"  Anthropic:  {ENV_PROVIDER}=anthropic  ANTHROPIC_API_KEY=<key>"
        f"  [{ENV_MODEL}={DEFAULT_MODELS['anthropic']}]\n"
        f"  OpenAI:     {ENV_PROVIDER}=openai  OPENAI_API_KEY=<key>  [{ENV_MODEL}={DEFAULT_MODELS['openai']}]\n"
        f"  Local or other OpenAI-compatible server (vLLM, Ollama, llama.cpp, LM Studio):\n"
        f"              {ENV_PROVIDER}=openai-compatible  {ENV_BASE_URL}=http://localhost:8000/v1"
        f"  {ENV_MODEL}=<served model name>  [KSCOUT_API_KEY=<key, if the server wants one>]\n"
        f"Optional caps: {ENV_MAX_USD}=5  {ENV_MAX_TOKENS}=2000000\n"
        "or put the same settings (provider, model, base_url, api_key, max_usd, max_tokens_total) in an [llm]\n"
        "section of ./kscout.toml or ~/.config/kscout/config.toml."
    )


def _brief(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()[:5])
