"""kvcast inside SGLang 0.5.23: its cache selection, its default cache, its release path.

Nothing is stubbed. The cache is what SGLang's ``create_tree_cache`` builds from a parsed
command line (``--radix-cache-backend kvcast`` or nothing), the backend name is registered by
SGLang's own plugin loader from kvcast's installed entry point, and requests go through
SGLang's ``release_kv_cache`` (``tests/engines/sglang_parts.py`` stands in for the scheduler's
admission steps only). The strategy's clock is the tests' own, so that "past the median"
happens on cue.
"""

from __future__ import annotations

import json
import math
import random
from array import array
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.srt.mem_cache.evict_policy import EvictionStrategy
from sglang.srt.mem_cache.registry import registered_radix_cache_backends
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.plugins import load_plugins

from kvcast.exporters.kit.adapters.sglang import IACStrategy, RustTreeCoreError, install
from kvcast.exporters.kit.index import PriorityIndex
from tests.engines.sglang_parts import (
    Engine,
    build_engine,
    cached_tokens,
    evict,
    model_dir,
    publish_server_args,
    serve,
)

TABLE = {
    "version": 1,
    "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
    "states": [
        {"intent": "coding", "turn": 1, "p_continue": 0.9, "median_reuse_s": 50.0},
        {"intent": "coding", "turn": 2, "p_continue": 0.6, "median_reuse_s": 80.0},
        {"intent": "chitchat", "turn": 1, "p_continue": 0.2, "median_reuse_s": 500.0},
    ],
}
STATES = [("coding", 1), ("coding", 2), ("chitchat", 1), ("travel", 3), None]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Table:
    """A table source whose index a test swaps, as a refreshing TableClient does."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.index = PriorityIndex(document)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def table_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("table") / "table.json"
    path.write_text(json.dumps(TABLE))
    return path


@pytest.fixture(scope="module", autouse=True)
def plugins_loaded() -> None:
    load_plugins()  # SGLang's own loader, as its scheduler process runs it


@pytest.fixture
def kvcast_engine(model: Path, table_file: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("KVCAST_TABLE", str(table_file))
    engine = build_engine(publish_server_args(model, "--radix-cache-backend", "kvcast"))
    strategy(engine).clock = Clock()
    return engine


def stock_engine(model: Path) -> Engine:
    return build_engine(publish_server_args(model))


def strategy(engine: Engine) -> IACStrategy:
    found = engine.cache.tree_core.eviction_strategy
    assert isinstance(found, IACStrategy)
    return found


def conversation(seed: int, turns: int, prompt_tokens: int, output_tokens: int) -> list[Any]:
    """Each turn's prompt extends the previous prompt and reply, as a chat's does."""
    base = 100_000 * (seed + 1)
    history: list[int] = []
    requests = []
    for turn in range(turns):
        prompt = history + [base + turn * 1000 + i for i in range(prompt_tokens)]
        output = [base + turn * 1000 + 500 + i for i in range(output_tokens)]
        requests.append((prompt, output))
        history = prompt + output
    return requests


# -- the way in ---------------------------------------------------------------------------------


def test_sglangs_plugin_loader_registers_the_kvcast_backend() -> None:
    names = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert names.get("kvcast") == "kvcast.exporters.kit.plugins:register_sglang"
    assert "kvcast" in registered_radix_cache_backends()


def test_the_backend_builds_sglangs_default_cache_on_the_python_tree_core(
    kvcast_engine: Engine, model: Path
) -> None:
    stock = stock_engine(model)
    assert type(kvcast_engine.cache) is type(stock.cache) is UnifiedRadixCache
    assert kvcast_engine.cache.tree_components == stock.cache.tree_components
    assert type(stock.cache.tree_core).__name__ == "RustUnifiedTreeCore"  # the default
    assert isinstance(kvcast_engine.cache.tree_core, UnifiedTreeCore)
    assert isinstance(strategy(kvcast_engine), EvictionStrategy)


def test_the_backend_without_a_table_url_says_what_is_missing(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVCAST_TABLE", raising=False)
    args = publish_server_args(model, "--radix-cache-backend", "kvcast")
    with pytest.raises(ValueError, match="needs the table's URL in KVCAST_TABLE"):
        build_engine(args)


def test_the_rust_tree_core_is_refused_with_the_way_out(model: Path) -> None:
    stock = stock_engine(model)
    with pytest.raises(RustTreeCoreError, match="Python tree core"):
        install(stock.cache, PriorityIndex(TABLE))


def test_installing_twice_is_refused(kvcast_engine: Engine) -> None:
    with pytest.raises(ValueError, match="already installed"):
        install(kvcast_engine.cache, PriorityIndex(TABLE))


# -- untagged traffic: exactly stock ----------------------------------------------------------


def observe(engine: Engine, prompts: list[list[int]]) -> tuple[Any, ...]:
    return (
        tuple(cached_tokens(engine, p) for p in prompts),
        engine.cache.evictable_size(),
        engine.slots.available_size(),
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_untagged_traffic_hits_and_evicts_exactly_as_stock(
    kvcast_engine: Engine, model: Path, seed: int
) -> None:
    """Against SGLang's default build (the Rust tree core and its LRU), step for step."""
    rng = random.Random(seed)
    convs = [conversation(c, rng.randint(1, 4), rng.randint(5, 60), rng.randint(1, 20))
             for c in range(12)]  # fmt: skip
    stock = stock_engine(model)
    pending = [list(c) for c in convs]
    prompts = [p for c in convs for p, _ in c]
    while any(pending):
        conv = rng.choice([c for c in pending if c])
        prompt, output = conv.pop(0)
        _, hit_stock = serve(stock, prompt, output)
        _, hit_kvcast = serve(kvcast_engine, prompt, output)
        assert hit_kvcast == hit_stock
        if rng.random() < 0.3:
            tokens = rng.randint(1, 200)
            assert evict(kvcast_engine, tokens) == evict(stock, tokens)
        assert observe(kvcast_engine, prompts) == observe(stock, prompts)
    while stock.cache.evictable_size():
        assert evict(kvcast_engine, 37) == evict(stock, 37)
        assert observe(kvcast_engine, prompts) == observe(stock, prompts)


# -- tagged traffic: the table's order --------------------------------------------------------


def expected_key(engine: Engine, node: Any, released: dict[int, Any], now: float) -> Any:
    """The tuple the table gives a node, from the test's own record of who released it last."""
    last = released.get(id(node))
    if last is None or last[0] is None:
        return (-1, node.last_access_time)
    (intent, turn), released_at = last
    return PriorityIndex(TABLE).priority(intent, turn, now - released_at, len(node.key))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=st.lists(
        st.tuples(
            st.integers(0, 7),  # conversation
            st.sampled_from(STATES),
            st.integers(1, 40),  # new prompt tokens
            st.integers(1, 12),  # output tokens
            st.floats(0.0, 120.0),  # seconds since the previous request
        ),
        min_size=2,
        max_size=30,
    ),
    later_s=st.floats(0.0, 600.0),
)
def test_every_eviction_takes_the_leaf_the_table_ranks_lowest(
    kvcast_engine: Engine, plan: list[Any], later_s: float
) -> None:
    engine = kvcast_engine
    engine.cache.reset()
    clock = strategy(engine).clock
    released: dict[int, Any] = {}
    histories: dict[int, list[int]] = {}
    for conv, state, new_tokens, out_tokens, gap_s in plan:
        clock.now += gap_s
        base = 100_000 * (conv + 1) + len(histories.get(conv, [])) * 10
        prompt = histories.get(conv, []) + [base + i for i in range(new_tokens)]
        output = [base + 5000 + i for i in range(out_tokens)]
        req, _ = serve(engine, prompt, output, state)
        histories[conv] = prompt + output
        for node in engine.paths[req.rid]:
            released[id(node)] = (state, clock.now)
    clock.now += later_s
    leaves = engine.cache.tree_core.evictable_device_leaves
    while leaves:
        before = set(leaves)
        keys = {id(n): expected_key(engine, n, released, clock.now) for n in before}
        assert evict(engine, 1) > 0
        gone = [n for n in before if n not in leaves]
        assert len(gone) == 1
        lowest = min(keys.values())
        assert keys[id(gone[0])] == lowest, (keys[id(gone[0])], lowest)


def test_past_the_median_goes_first_then_the_least_likely_to_continue(
    kvcast_engine: Engine,
) -> None:
    engine = kvcast_engine
    clock = strategy(engine).clock
    prompts = {}
    for name, state, at in [
        ("coding t1, 60 s old (past 50 s)", ("coding", 1), 0.0),
        ("chitchat t1, 40 s old (inside 500 s)", ("chitchat", 1), 20.0),
        ("coding t1, 10 s old", ("coding", 1), 50.0),
        ("untagged", None, 55.0),
        ("travel t3, unlisted: defaults, 5 s old", ("travel", 3), 55.0),
    ]:
        clock.now = 1000.0 + at
        prompt = [hash(name) % 10**6 * 100 + i for i in range(30)]
        serve(engine, prompt, [1, 2, 3], state)
        prompts[name] = prompt
    clock.now = 1060.0
    order = []
    while len(order) < len(prompts):
        evict(engine, 34)  # one request's 33 tokens; its two nodes go one after the other
        order += [name for name, p in prompts.items()
                  if name not in order and cached_tokens(engine, p) == 0]  # fmt: skip
    assert order == [
        "untagged",
        "coding t1, 60 s old (past 50 s)",
        "chitchat t1, 40 s old (inside 500 s)",
        "travel t3, unlisted: defaults, 5 s old",
        "coding t1, 10 s old",
    ]


def test_install_on_a_cache_built_by_hand_follows_a_refreshed_table(model: Path) -> None:
    """The documented install(): SGLang's default cache on the Python tree core, a table
    source whose index changes as a refreshing TableClient's does."""
    engine = build_engine(publish_server_args(model), tree_core="python")
    table = Table(TABLE)
    installed = install(engine.cache, table, clock=Clock())
    coding, chat = [7_000_000 + i for i in range(20)], [8_000_000 + i for i in range(20)]
    serve(engine, coding, [1], ("coding", 1))
    serve(engine, chat, [1], ("chitchat", 1))
    assert installed.get_priority(engine.paths["r1"][0])[1:] == (0.9, 1)
    flipped = json.loads(json.dumps(TABLE))
    flipped["version"] = 2
    flipped["states"][0]["p_continue"] = 0.1  # coding t1 is now the least likely
    table.index = PriorityIndex(flipped)
    evict(engine, 21)
    assert cached_tokens(engine, coding) == 0
    assert cached_tokens(engine, chat) == 20


def test_tagged_traffic_hits_as_stock_while_nothing_is_evicted(
    kvcast_engine: Engine, model: Path
) -> None:
    stock = stock_engine(model)
    rng = random.Random(7)
    for c in range(10):
        for prompt, output in conversation(c, 3, rng.randint(5, 50), rng.randint(1, 9)):
            _, hit_stock = serve(stock, prompt, output)
            _, hit_kvcast = serve(kvcast_engine, prompt, output, rng.choice(STATES))
            assert hit_kvcast == hit_stock
    assert kvcast_engine.cache.evictable_size() == stock.cache.evictable_size()
    assert kvcast_engine.slots.available_size() == stock.slots.available_size()


def test_the_backend_refuses_flags_that_select_another_cache(
    model: Path, table_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVCAST_TABLE", str(table_file))
    args = publish_server_args(model, "--radix-cache-backend", "kvcast", "--enable-lmcache")
    with pytest.raises(ValueError, match="--enable-lmcache selects another cache"):
        build_engine(args)


def readme_sglang_request() -> dict[str, Any]:
    """The request body of docs/engines.md's SGLang recipe (its curl line), as a user pastes it."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "engines.md").read_text()
    section = readme[readme.index("### SGLang (0.5.23)") :]
    body = section[section.index("-d '") + 4 :]
    return json.loads(body[: body.index("'")])


def test_the_readmes_request_reaches_the_req_through_sglangs_openai_protocol() -> None:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    from kvcast.exporters.kit.adapters.sglang import request_state

    request = ChatCompletionRequest(**readme_sglang_request())
    params = request.to_sampling_params(stop=[], model_generation_config={})
    req = Req("r", "", array("q", [1, 2, 3]), SamplingParams(**params))
    assert request_state(req) == ("code_debugging", 3)


# -- the density policy --------------------------------------------------------------------------

DENSITY_TABLE = {
    **TABLE,
    "characteristic_time_s": 90.0,
    "states": [
        {**row, "mu": math.log(row["median_reuse_s"]), "sigma": sigma, "conversations": 100}
        for row, sigma in zip(TABLE["states"], (0.5, 0.9, 1.6), strict=True)
    ],
}


@pytest.fixture
def density_engine(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    path = tmp_path / "density-table.json"
    path.write_text(json.dumps(DENSITY_TABLE))
    monkeypatch.setenv("KVCAST_TABLE", str(path))
    monkeypatch.setenv("KVCAST_POLICY", "density")
    engine = build_engine(publish_server_args(model, "--radix-cache-backend", "kvcast"))
    strategy(engine).clock = Clock()
    return engine


def evict_lowest_first(engine: Engine, key: Callable[[Any], Any]) -> list[Any]:
    """Empty the cache a leaf at a time through SGLang's own ``evict``, checking that each leaf
    that goes has the lowest ``key`` of the leaves then; the leaves in the order they went."""
    gone_order = []
    leaves = engine.cache.tree_core.evictable_device_leaves
    while leaves:
        before = set(leaves)
        keys = {id(n): key(n) for n in before}
        assert evict(engine, 1) > 0
        gone = [n for n in before if n not in leaves]
        assert len(gone) == 1
        assert keys[id(gone[0])] == min(keys.values())
        gone_order.append(gone[0])
    return gone_order


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=st.lists(
        st.tuples(
            st.integers(0, 7),
            st.sampled_from(STATES),
            st.integers(1, 40),
            st.integers(1, 12),
            st.floats(0.0, 300.0),
        ),
        min_size=2,
        max_size=25,
    ),
    later_s=st.floats(0.0, 2000.0),
)
def test_density_every_eviction_takes_the_leaf_the_client_ranks_lowest(
    density_engine: Engine, plan: list[Any], later_s: float
) -> None:
    """KVCAST_POLICY=density through SGLang's plugin loader and its own eviction: every leaf
    that goes is the one with the lowest ``priority(..., policy="density")``."""
    engine = density_engine
    engine.cache.reset()
    assert strategy(engine).policy == "density"
    clock = strategy(engine).clock
    index = PriorityIndex(DENSITY_TABLE)
    released: dict[int, Any] = {}
    histories: dict[int, list[int]] = {}
    for conv, state, new_tokens, out_tokens, gap_s in plan:
        clock.now += gap_s
        base = 100_000 * (conv + 1) + len(histories.get(conv, [])) * 10
        prompt = histories.get(conv, []) + [base + i for i in range(new_tokens)]
        output = [base + 5000 + i for i in range(out_tokens)]
        req, _ = serve(engine, prompt, output, state)
        histories[conv] = prompt + output
        for node in engine.paths[req.rid]:
            released[id(node)] = (state, clock.now)
    clock.now += later_s

    def key(node: Any) -> Any:
        last = released.get(id(node))
        if last is None or last[0] is None:
            return (-1, node.last_access_time)
        (intent, turn), at = last
        return (0, *index.priority(intent, turn, clock.now - at, len(node.key), policy="density"))

    evict_lowest_first(engine, key)


@pytest.mark.parametrize(("shared_p", "prompt_outlives_c"), [(0.99, True), (0.01, False)])
def test_a_prompt_a_second_conversation_finds_cached_is_ranked_by_the_shared_law(
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shared_p: float,
    prompt_outlives_c: bool,
) -> None:
    """Through SGLang's own match, release and eviction: the nodes a turn-1 request found
    cached (its ``cached_tokens``) are marked shared and ranked by the table's shared law,
    every other node by its last request's state, each as the client's ``priority`` says."""
    from kvcast.exporters.kit.adapters.sglang import SHARED_ATTR
    from kvcast.exporters.kit.index import SHARED_INTENT

    shared = {"p_continue": shared_p, "median_reuse_s": 5.0, "mu": math.log(5.0), "sigma": 0.5,
              "references": 1000, "lives": 10}  # fmt: skip
    document = {**DENSITY_TABLE, "shared": shared}
    path = tmp_path / "shared-table.json"
    path.write_text(json.dumps(document))
    monkeypatch.setenv("KVCAST_TABLE", str(path))
    monkeypatch.setenv("KVCAST_POLICY", "density")
    engine = build_engine(publish_server_args(model, "--radix-cache-backend", "kvcast"))
    clock = strategy(engine).clock = Clock()
    index = PriorityIndex(document)
    system = list(range(1, 41))
    released: dict[int, tuple[str, float]] = {}  # node -> (intent it ranks by, released at)
    # Outputs as long as the prompts: a node's density is per token, so a short output node
    # would outrank (and so hold in place) the prompt node above it.
    a, _ = serve(engine, system + list(range(100, 120)), list(range(150, 180)), ("chat", 1))
    released.update((id(n), ("chat", clock.now)) for n in engine.paths[a.rid])
    clock.now += 1.0
    b, hit = serve(engine, system + list(range(200, 220)), list(range(250, 280)), ("chat", 1))
    assert hit == 40 and b.cached_tokens == 40
    released.update((id(n), ("chat", clock.now)) for n in engine.paths[b.rid])
    prompt_node = engine.paths[b.rid][-1]
    assert prompt_node.__dict__.get(SHARED_ATTR) and len(prompt_node.key) == 40
    released[id(prompt_node)] = (SHARED_INTENT, clock.now)
    clock.now += 1.0
    c, _ = serve(engine, list(range(300, 330)), list(range(350, 380)), ("coding", 1))
    released.update((id(n), ("coding", clock.now)) for n in engine.paths[c.rid])
    clock.now += 1.0

    def key(node: Any) -> Any:
        intent, at = released[id(node)]
        return (0, *index.priority(intent, 1, clock.now - at, len(node.key), policy="density"))

    gone_order = evict_lowest_first(engine, key)
    c_node = engine.paths[c.rid][-1]  # coding valued between the two shared laws
    assert (gone_order.index(prompt_node) > gone_order.index(c_node)) == prompt_outlives_c


def test_a_split_shared_node_stays_shared_in_both_parts(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang splits a node where a request's tokens leave it: a later turn of a
    conversation that shares only the first half of a shared prompt cuts the prompt's node in
    two, and the first part (a new node) is as shared as the prompt was, so that turn's
    release ranks it by the shared law, not by the turn's own state."""
    from kvcast.exporters.kit.adapters.sglang import SHARED_ATTR, TAG_ATTR
    from kvcast.exporters.kit.index import SHARED_INTENT

    shared = {"p_continue": 0.9, "median_reuse_s": 5.0, "mu": math.log(5.0), "sigma": 0.5,
              "references": 1000, "lives": 10}  # fmt: skip
    path = tmp_path / "shared-table.json"
    path.write_text(json.dumps({**DENSITY_TABLE, "shared": shared}))
    monkeypatch.setenv("KVCAST_TABLE", str(path))
    monkeypatch.setenv("KVCAST_POLICY", "density")
    engine = build_engine(publish_server_args(model, "--radix-cache-backend", "kvcast"))
    strategy(engine).clock = Clock()
    system = list(range(1, 41))
    serve(engine, system + list(range(100, 120)), list(range(150, 180)), ("chat", 1))
    b, _ = serve(engine, system + list(range(200, 220)), list(range(250, 280)), ("chat", 1))
    prompt_node = engine.paths[b.rid][-1]
    assert prompt_node.__dict__.get(SHARED_ATTR) and len(prompt_node.key) == 40
    d, hit = serve(engine, system[:20] + list(range(400, 420)), list(range(450, 460)), ("chat", 2))
    assert hit == 20
    first_half = engine.paths[d.rid][-1]
    assert first_half is not prompt_node and len(first_half.key) == 20
    assert prompt_node.parent is first_half and len(prompt_node.key) == 20
    for node in (first_half, prompt_node):
        assert node.__dict__.get(SHARED_ATTR)
    assert first_half.__dict__[TAG_ATTR][0].state == (SHARED_INTENT, 1)
