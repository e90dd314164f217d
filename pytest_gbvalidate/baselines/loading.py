"""Reading a baseline file: YAML whose mappings remember their lines, aliases bounded, every error one line
naming the file, the line and the field."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml

from pytest_gbvalidate.baselines.fields import _Mapping
from pytest_gbvalidate.baselines.model import Baseline, BaselineError, _shown, baseline_path, known_skus, nccl_env
from pytest_gbvalidate.baselines.schema import baseline_from
from pytest_gbvalidate.labels import printable

# The most nodes the aliases (*name) of one baseline may stand for, counted as expanded. A baseline uses a few or
# none (cpu.yaml: 3 scalars); a "billion laughs" document of nested aliases is refused as soon as it passes the bound.
MAX_ALIAS_NODES = 1000
# The deepest a baseline may nest (its deepest field is 7 levels down: metrics.x.values.label.params.nccl_env):
# PyYAML composes each level in a recursive call, and thousands of `[` would exhaust Python's stack.
MAX_DEPTH = 32


@functools.cache
def _loader() -> type[yaml.SafeLoader]:
    """A SafeLoader that builds _Mappings, rejects duplicate keys and bounds what aliases expand to (and refuses a
    recursive one). Built on first use: only a run that reads baselines needs PyYAML."""
    import yaml

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> _Mapping:
        loader.flatten_mapping(node)
        mapping = _Mapping()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise BaselineError(f"{key_node.start_mark.line + 1}: keys must be strings, got {_shown(key)}")
            if key in mapping:
                raise BaselineError(f"{key_node.start_mark.line + 1}: duplicate key {_shown(key)}")
            mapping[key] = loader.construct_object(value_node, deep=True)
            mapping.key_lines[key] = key_node.start_mark.line + 1
        return mapping

    class Loader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.expanded: dict[yaml.Node, int] = {}  # each node composed so far -> its size, aliases expanded
            self.alias_nodes = 0
            self.depth = 0  # of the node being composed

        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            event = self.peek_event()  # type: ignore[no-untyped-call]  # the stubs leave it untyped
            line = event.start_mark.line + 1 if event.start_mark is not None else 0
            if self.depth >= MAX_DEPTH:
                raise BaselineError(f"{line}: nested more than {MAX_DEPTH} levels deep (a baseline needs 7)")
            self.depth += 1
            try:
                node = super().compose_node(parent, index)
            finally:
                self.depth -= 1
            if node is None:
                return None
            if isinstance(event, yaml.AliasEvent):
                size = self.expanded.get(node)
                if size is None:  # its anchor's node is still being composed: the alias is inside it
                    raise BaselineError(f"{line}: alias {_shown(event.anchor)} is inside its own anchor")
                self.alias_nodes += size
                if self.alias_nodes > MAX_ALIAS_NODES:
                    raise BaselineError(
                        f"{line}: alias {_shown(event.anchor)}: aliases stand for more than {MAX_ALIAS_NODES} "
                        "nodes (a baseline needs a few aliases or none)"
                    )
            elif isinstance(node, yaml.SequenceNode):
                self.expanded[node] = 1 + sum(self.expanded[child] for child in node.value)
            elif isinstance(node, yaml.MappingNode):
                self.expanded[node] = 1 + sum(self.expanded[k] + self.expanded[v] for k, v in node.value)
            else:
                self.expanded[node] = 1
            return node

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return Loader


MAX_BASELINE_BYTES = 2**20  # the largest bundled baseline is about 10 KiB (aliases are bounded apart: MAX_ALIAS_NODES)


def strict_yaml(text: str) -> Any:
    """YAML as the baselines are read: duplicate keys and runaway aliases refused (BaselineError, with the line)."""
    import yaml

    return yaml.load(text, Loader=_loader())  # noqa: S506 -- a SafeLoader subclass


def load_baseline(path: Path) -> Baseline:
    """Read and validate one baseline file; a BaselineError names the file, line and field, or a file that says what
    runs (runs_what) that others than root and this user could have written."""
    from pytest_gbvalidate.files import InputError, read_input, writable_by_others

    try:
        data = read_input(path, MAX_BASELINE_BYTES)
    except InputError as exc:
        raise BaselineError(str(exc)) from None
    baseline = parse_baseline(path, data)
    decides = runs_what(baseline)
    # As a Slurm Prolog or HealthCheckProgram the run is root: whoever can write this file would choose what root
    # executes -- unless they can change the code reading it too (then refusing protects nothing).
    if decides and (problem := writable_by_others(path)) is not None and writable_by_others(Path(__file__)) is None:
        raise BaselineError(
            f"{path}: {decides} says what the run executes or loads, and only a file that root or this user alone "
            f"can write may say that: {problem} (give it on the command line instead, or fix the permissions)"
        )
    return baseline


def declared_sku(path: Path) -> str | None:
    """The `sku` the file at `path` declares; None where it is absent or not such a file (the loader says why)."""
    import yaml

    from pytest_gbvalidate.files import InputError, read_input

    try:
        doc = strict_yaml(read_input(path, MAX_BASELINE_BYTES).decode("utf-8"))
    except (InputError, UnicodeDecodeError, BaselineError, yaml.YAMLError):
        return None
    sku = doc.get("sku") if isinstance(doc, dict) else None
    return sku if isinstance(sku, str) else None


def runs_what(baseline: Baseline) -> str | None:
    """The fields of `baseline` that choose what the run executes or loads (a command, a library NCCL loads
    through its environment), or None."""
    fields = []
    if baseline.pretrain is not None and baseline.pretrain.engine_python is not None:
        fields.append("pretrain.engine_python")
    fields += [f"{metric}'s params.nccl_env {name}" for name, (_, metric) in nccl_env(baseline).items()]
    return ", ".join(fields) or None


def parse_baseline(path: Path, data: bytes) -> Baseline:
    """Validate the bytes of a baseline file that is (or will be) at `path`, as load_baseline does."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise BaselineError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    import yaml

    try:
        doc = strict_yaml(text)
    except BaselineError as exc:
        raise BaselineError(f"{path}:{exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise BaselineError(f"{where}: YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:  # a control character (NUL, ESC, ...) YAML does not allow in a file
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        raise BaselineError(f"{path}:{line}:{column}: YAML does not allow the character {char}") from None
    except yaml.YAMLError as exc:
        raise BaselineError(f"{path}: YAML error: {' '.join(str(exc).split())}") from None
    control = _control_character(doc)
    if control is not None:
        raise BaselineError(f"{path}: {control}: a baseline holds text, not terminal or direction controls")
    return baseline_from(path, doc)


# What a baseline's text may not hold, though a quoted YAML string may spell it ("\e[2J"): C0 and C1 controls but
# line breaks and tabs (an escape reaches the terminal), and the Unicode direction overrides and isolates.
_DIRECTION_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROLS = frozenset({*map(chr, [*range(0x20), *range(0x7F, 0xA0)]), *_DIRECTION_CONTROLS} - {"\t", "\n"})


def _control_character(doc: Any) -> str | None:
    """Where the loaded `doc` first holds a control character (`metrics.x.provenance holds U+001B`), or None."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, f"{where} (a key)"))
                stack.append((item, f"{where}.{key}" if where else str(key)))
        elif isinstance(value, list):
            stack += [(item, f"{where}[{i}]") for i, item in enumerate(value)]
        elif isinstance(value, str) and (found := next((c for c in value if c in _CONTROLS), None)) is not None:
            return f"{printable(where) if where else 'the document'} holds U+{ord(found):04X}"
    return None


def load_all(directory: Path) -> list[Baseline]:
    return [load_baseline(baseline_path(directory, sku)) for sku in known_skus(directory)]
