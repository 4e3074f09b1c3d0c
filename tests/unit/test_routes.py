"""Model routes: the canary split is the share of picks each version gets, and promotion keeps
one stable version beside the canary."""

from __future__ import annotations

import random

import pytest

from cascade.serving.inference import ModelRoutes, Route


@pytest.mark.parametrize("canary", [1, 20, 30, 50, 99])
def test_picks_follow_the_canary_share(canary: int) -> None:
    routes = ModelRoutes(rng=random.Random(7))
    routes.promote("m", Route("1", "svc-1", 100), None)
    assert routes.promote("m", Route("2", "svc-2", 100), canary) == []
    picks = [routes.pick("m") for _ in range(100_000)]
    share = sum(1 for r in picks if r is not None and r.version == "2") / len(picks)
    assert share == pytest.approx(canary / 100, abs=0.005)  # binomial sigma at most 0.0016


def test_a_pinned_version_is_that_version_and_an_unknown_model_has_no_route() -> None:
    routes = ModelRoutes()
    routes.promote("m", Route("1", "svc-1", 100), None)
    routes.promote("m", Route("2", "svc-2", 100), 10)
    assert routes.pick("m", "1") == Route("1", "svc-1", 90)
    assert routes.pick("m", "3") is None and routes.pick("other") is None


def test_promotion_without_a_canary_drops_every_other_version() -> None:
    routes = ModelRoutes()
    routes.promote("m", Route("1", "svc-1", 100), None)
    routes.promote("m", Route("2", "svc-2", 100), 30)
    assert routes.promote("m", Route("3", "svc-3", 100), 10) == ["svc-2"], "the old canary goes"
    assert routes.live()["m"] == [{"version": "1", "percent": 90, "service": "svc-1"},
                                  {"version": "3", "percent": 10, "service": "svc-3"}]
    assert sorted(routes.promote("m", Route("3", "svc-3", 100), None)) == ["svc-1"]
    assert routes.live()["m"] == [{"version": "3", "percent": 100, "service": "svc-3"}]
