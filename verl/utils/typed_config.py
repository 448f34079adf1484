"""Typed config sections: a dataclass per section of the YAML, its rules in `__post_init__`.

The shipped YAML (`verl/trainer/config/*.yaml`) is the one place a default is written; a section class names the
keys of one YAML section with their types, and `@config_section(prefix)` fills every field that has no explicit
default from the YAML's value at `prefix.<field>`, so `ActorConfig()` is the shipped actor section and
`ActorConfig.from_config(node)` a run's.

Loading a run's config (`check_config_types`) assigns each composed value to `OmegaConf.structured(schema)`, so
OmegaConf checks and converts the types (an int for a float, a string for an int fails), and collects every
mistake with the key's name. Two things OmegaConf accepts that we do not: any truthy value for a bool (`3`,
`"yes"`), checked here strictly, and null for a field not declared Optional is reported as a type error too. Two
forms of the seeds' and verl's launch scripts are read as they mean: a string for a one-item list
(`trainer.logger=console`), and an empty value (`key=` from an unset shell variable), false for a bool (with a
warning line) and an error naming the key for other types. Keys a user added on purpose with `+` are not part of
the schema and are passed over.

`build_section(cls, typed, problems)` then builds the section objects children first, which runs the
`__post_init__` rules of every section, and collects what they raise into one list, so one run reports every
broken rule.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from verl.utils.config import ConfigError, default_of, is_verl_only

T = TypeVar("T")

_TYPE_NAMES = {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
               dict: "a mapping"}


class Section:
    """Base of the section classes: runs `check(problems)` after construction and raises one ConfigError listing
    every broken rule it found (subclasses extend `check`, calling super's)."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        self.check(problems)
        raise_problems(problems)

    def check(self, problems: list[str]) -> None:
        pass


def _shipped(key: str, config_name: str) -> Any:
    return default_of(key, config_name)


def _unchecked(cls: type[T]) -> T:
    """The shipped default of section `cls` without running its rules (a default need not be runnable: generation
    has no data.path until the user gives one)."""
    section = cls.__new__(cls)
    for f in dataclasses.fields(cls):
        section.__dict__[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return section


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp) and hasattr(tp, "__config_prefix__")


def config_section(prefix: str, config_name: str = "ppo_trainer"):
    """Class decorator: make `cls` a dataclass whose fields without a default take the shipped YAML's value of
    `prefix.<field>` (read from `config_name`); a field typed with another section class defaults to that section."""

    def wrap(cls: type[T]) -> type[T]:
        hints = typing.get_type_hints(cls)
        if "__annotations__" not in cls.__dict__:
            cls.__annotations__ = {}
        own = cls.__dict__["__annotations__"]
        for base in cls.__mro__[1:]:  # inherited keys take this section's defaults (generation's rollout: name hf)
            for f in getattr(base, "__dataclass_fields__", {}).values():
                factory = f.default_factory
                if isinstance(factory, functools.partial) and factory.func is _shipped and f.name not in own:
                    own[f.name] = hints[f.name]
        for name in own:
            if name.startswith("_") or name in cls.__dict__:
                continue
            hint = hints[name]
            if is_section(hint):
                setattr(cls, name, dataclasses.field(default_factory=functools.partial(_unchecked, hint)))
            else:
                setattr(cls, name, dataclasses.field(
                    default_factory=functools.partial(_shipped, f"{prefix}.{name}", config_name)))
        cls.__config_prefix__ = prefix
        cls = dataclasses.dataclass(cls)
        cls.from_config = classmethod(_from_config)
        return cls

    return wrap


def _from_config(cls: type[T], node: Any) -> T:
    """The section object of `node` (a DictConfig, a mapping or None): keys it has, shipped defaults for the rest.
    Types are checked and every section's `__post_init__` rules run; any problem raises one ConfigError."""
    typed = OmegaConf.structured(cls)
    problems = _assign(typed, node if OmegaConf.is_config(node) else OmegaConf.create(node or {}),
                       cls.__config_prefix__ + ".")
    section = build_section(cls, typed, problems) if not problems else None
    if problems:
        raise ConfigError("\n".join(problems))
    return section


def build_section(cls: type[T], node: DictConfig, problems: list[str]) -> T:
    """The object of section `cls` from its typed node, children first; each section's rules add what they find to
    `problems`. A section whose rules fail is still returned (built without its checks), so that the sections
    around it are checked too and one run reports every broken rule."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        tp = _plain_type(hints[f.name])[0]
        if is_section(tp) and isinstance(node._get_node(f.name), DictConfig):
            kwargs[f.name] = build_section(tp, node[f.name], problems)
        else:
            value = node[f.name]
            kwargs[f.name] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    try:
        return cls(**kwargs)
    except ConfigError as err:
        problems.extend(str(err).split("\n"))
    section = cls.__new__(cls)
    section.__dict__.update(kwargs)
    return section


# ------------------------------------------------------------------------------------------------ type checking
def _plain_type(tp: Any) -> tuple[Any, bool]:
    """(the type without Optional, whether None is allowed)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else Any), len(args) < len(typing.get_args(tp))
    return tp, tp is Any


def _type_name(tp: Any) -> str:
    base = typing.get_origin(tp) or tp
    return _TYPE_NAMES.get(base, getattr(base, "__name__", str(base)))


def _assign(typed: DictConfig, cfg: DictConfig, prefix: str) -> list[str]:
    """Assign every value of `cfg` that the schema `typed` declares, recursing into sections; the problems found."""
    problems: list[str] = []
    hints = _type_hints(OmegaConf.get_type(typed))
    for key in cfg.keys():
        if key not in hints:  # added with +key=value on purpose (unknown keys without + were refused before)
            if is_verl_only(f"{prefix}{key}"):  # verl 0.9's: announced with the inert keys, with the reason
                continue
            print(f"[config] {prefix}{key} is not one of Quiver's keys: it stays in the config for code of your own "
                  "(a plug-in may read it) and Quiver itself ignores it")
            continue
        path = f"{prefix}{key}"
        node = cfg._get_node(key)
        tp, nullable = _plain_type(hints[key])
        raw = node._value() if not isinstance(node, (DictConfig, ListConfig)) else node
        if is_section(tp):
            if isinstance(node, DictConfig) and not node._is_none():
                problems.extend(_assign(typed[key], node, path + "."))
            elif not (raw is None and nullable):
                problems.append(f"{path} must be a mapping, got {OmegaConf.to_container(cfg)[key]!r}")
            continue
        if isinstance(raw, str) and OmegaConf.is_interpolation(cfg, key):
            typed[key] = raw  # resolved and checked on use; the schema only keeps the interpolation
            continue
        if raw is None:
            if nullable or tp is Any:
                typed[key] = None
            else:
                problems.append(f"{path}=null must be {_type_name(tp)} (it has no null setting)")
            continue
        if raw == "" and tp is not str and tp is not Any:  # `key=` from a shell variable the script never set
            if tp is bool:
                print(f"[config] {path}= is empty (an unset shell variable in the launch script?): read as false")
                typed[key] = cfg[key] = False
            else:
                problems.append(f"{path}= is empty and must be {_type_name(tp)}: is the shell variable the launch "
                                "script passes for it unset?")
            continue
        if (typing.get_origin(tp) or tp) is list and isinstance(raw, str):
            raw = [raw]  # verl scripts write key=item for a one-item list: the run's config gets the list too
            cfg[key] = raw
        if tp is bool and not isinstance(raw, bool):
            problems.append(f"{path}={raw!r} must be true/false")
            continue
        try:
            typed[key] = raw
        except (ValidationError, OmegaConfBaseException):
            shown = OmegaConf.to_container(raw) if OmegaConf.is_config(raw) else raw
            problems.append(f"{path}={shown!r} must be {_type_name(tp)}")
    return problems


@functools.cache
def _typed_template(schema: type) -> DictConfig:
    """`OmegaConf.structured(schema)`, built once per process (it takes longer than Hydra's composition of the YAML;
    each check assigns into a copy)."""
    return OmegaConf.structured(schema)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_config_types(schema: type, cfg: DictConfig) -> DictConfig:
    """`cfg`'s values in `OmegaConf.structured(schema)`: raises ConfigError naming every key whose value has the
    wrong type for its field."""
    typed = copy.deepcopy(_typed_template(schema))
    problems = _assign(typed, cfg, "")
    if problems:
        raise ConfigError("\n".join(problems))
    return typed


def check_with(rule, *args, problems: list[str]) -> None:
    """Run an algorithm's own check of its settings (the one place that rule is written) and record its
    ValueError in `problems`."""
    try:
        rule(*args)
    except ValueError as err:
        problems.append(str(err))


def raise_problems(problems: list[str]) -> None:
    """The end of a section's `__post_init__`: one ConfigError listing every broken rule, if any."""
    if problems:
        raise ConfigError("\n".join(problems))
