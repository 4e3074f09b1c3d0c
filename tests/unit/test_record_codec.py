"""Records are JSON in both state stores: orjson writes them, and what it cannot write, or what an older release
wrote with the standard library, still round-trips."""

from __future__ import annotations

import json

from cascade.stores.base import dump_doc, load_doc


def test_a_record_round_trips_compactly_with_its_keys_made_strings() -> None:
    doc = {"id": "j1", "slots": [["n1", [0, 1], 0.5]], "seq": 1796168817416349, "ok": True, "none": None, 3: "x"}
    raw = dump_doc(doc)
    assert " " not in raw and json.loads(raw) == {**{k: v for k, v in doc.items() if k != 3}, "3": "x"}
    assert load_doc(raw) == json.loads(raw)


def test_what_orjson_refuses_goes_through_the_standard_library() -> None:
    huge = 2 ** 70  # beyond 64 bits
    assert load_doc(dump_doc({"n": huge})) == {"n": huge}


def test_nan_written_by_an_older_release_is_still_read_and_written_now_as_null() -> None:
    assert str(load_doc('{"loss": NaN}')["loss"]) == "nan"
    assert load_doc(dump_doc({"loss": float("nan")})) == {"loss": None}
