"""The model pool's memory budget: the container's limit, sizes known before loading, eviction before a load,
refusal of what cannot fit, one key per catalogue model however it is spelled."""
import pytest

from specdec.models import LoadedModel, ModelPool, entries, pool
from specdec.testing import tiny_folder, tiny_model



def stand_in(spec, **kwargs) -> LoadedModel:
    return LoadedModel(spec, tiny_model("llama", 0, vocab_size=64, layers=1, hidden=32), None, "test", None,
                       "float32")


SIZE = stand_in("any").memory_bytes  # what each stand-in model holds (and is estimated at)


@pytest.mark.parametrize("files, expected", [
    ({"memory.max": "max"}, "RAM"),  # cgroup v2 without a limit
    ({"memory.max": str(2**30)}, "container memory limit"),
    ({"memory.limit_in_bytes": str(2**30)}, "container memory limit"),  # cgroup v1
    ({"memory.limit_in_bytes": str(2**62)}, "RAM"),  # v1's "no limit" is a huge number
])
def test_the_budget_is_a_share_of_the_container_limit(tmp_path, monkeypatch, files, expected):
    paths = []
    for name in ("memory.max", "memory.limit_in_bytes"):
        paths.append(tmp_path / name)
        if name in files:
            paths[-1].write_text(files[name] + "\n")
    monkeypatch.setattr(pool, "CGROUP_LIMITS", tuple(paths))
    monkeypatch.delenv("SPECDEC_POOL_GB", raising=False)
    limit, source = pool.memory_limit()
    assert source == expected and (limit == 2**30) == (expected != "RAM")
    assert pool.default_budget_bytes() == int(limit * pool.BUDGET_FRACTION)
    assert f"of the {limit / 2**30:.1f} GB {expected}" in ModelPool(loader=stand_in).describe()


def test_a_folder_is_sized_from_its_safetensors_headers_before_loading(tmp_path):
    folder = str(tiny_folder(tmp_path / "t"))
    estimate = pool.estimate_bytes(folder, "float32")
    held = ModelPool(budget_bytes=10**9).get(folder, dtype="float32").memory_bytes
    assert estimate == pytest.approx(held, rel=0.03) and pool.estimate_bytes(folder, "bfloat16") == estimate // 2
    assert pool.estimate_bytes("org/not-downloaded", "float32") is None


def test_catalogue_entries_are_sized_from_their_parameter_count():
    entry = entries.catalogue()[0]
    number, scale = float(entry.parameters[:-1]), pool.SCALES[entry.parameters[-1].upper()]
    assert pool.estimate_bytes(entry.name.upper(), "bfloat16") == int(number * scale * 2)


def test_least_recently_used_models_are_dropped_before_the_next_load():
    held_while_loading = []

    def loader(spec, **kwargs):
        held_while_loading.append([m.name for m in models.loaded()])
        return stand_in(spec)
    models = ModelPool(budget_bytes=2 * SIZE + SIZE // 2, loader=loader, estimate=lambda spec, dtype: SIZE)
    for name in ("a", "b", "a", "c"):
        models.get(name)
    assert held_while_loading == [[], ["a"], ["a"]]  # b was dropped before c loaded, a (recent) kept


def test_a_model_larger_than_the_budget_is_refused_before_loading():
    def loader(spec, **kwargs):
        raise AssertionError("loaded a model that cannot fit")
    models = ModelPool(budget_bytes=SIZE, loader=loader, estimate=lambda spec, dtype: 3 * SIZE)
    with pytest.raises(ValueError, match=r"needs about .* more than the model memory budget .* or bfloat16"):
        models.get("huge", dtype="float32")


def test_one_catalogue_model_is_held_once_however_it_is_spelled():
    calls = []
    models = ModelPool(budget_bytes=10**13, loader=lambda spec, **kw: calls.append(spec) or stand_in(spec))
    name = entries.catalogue()[0].name
    for spelling in (name, name.upper(), f"  {name.title()} "):
        models.get(spelling, dtype="float32")
    assert calls == [name] and len(models.loaded()) == 1


def test_a_failed_load_releases_its_reservation():
    def failing(spec, **kwargs):
        raise ValueError("no such model")
    models = ModelPool(budget_bytes=SIZE, loader=failing, estimate=lambda spec, dtype: SIZE)
    with pytest.raises(ValueError, match="no such model"):
        models.get("a")
    models.loader = stand_in
    models.get("b")
    assert [m.name for m in models.loaded()] == ["b"]
