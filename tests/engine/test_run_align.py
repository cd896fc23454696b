"""Aligning two runs by meaning: identical runs, an inserted step, the same tool
with other arguments, a different final answer, a skipped step."""

from __future__ import annotations

from typing import Any

from runs.engine.run_align import RunStep, StepAction, align_runs, json_changes


def call(tool: str, status: str = "succeeded", obs: str = "ok", **args: Any) -> RunStep:
    return RunStep(
        index=0, kind="tool_calls", calls=(StepAction(tool, args, status, obs),)
    )


def answer(text: str) -> RunStep:
    return RunStep(index=0, kind="final_answer", text=text)


def indexed(*steps: RunStep) -> list[RunStep]:
    return [
        RunStep(
            index=i, kind=s.kind, calls=s.calls, text=s.text, input_delta=s.input_delta
        )
        for i, s in enumerate(steps)
    ]


def kinds(left: list[RunStep], right: list[RunStep]) -> list[str]:
    return [p.kind for p in align_runs(left, right).pairs]


def test_identical_runs_align_step_for_step_with_no_divergence() -> None:
    run = indexed(call("lookup_order", order_id="4821"), answer("Sorry about that."))
    alignment = align_runs(run, list(run))
    assert [p.kind for p in alignment.pairs] == ["same", "same"]
    assert alignment.first_divergence is None


def test_an_inserted_step_is_paired_with_nothing_and_the_rest_still_align() -> None:
    left = indexed(call("lookup_order", order_id="4821"), answer("Done."))
    right = indexed(
        call("lookup_order", order_id="4821"),
        call("get_delivery_date", order_id="4821"),
        answer("Done."),
    )
    alignment = align_runs(left, right)
    assert [p.kind for p in alignment.pairs] == ["same", "inserted", "same"]
    inserted = alignment.pairs[1]
    assert inserted.left is None and inserted.right is not None
    assert inserted.right.calls[0].tool == "get_delivery_date"
    first = alignment.first_divergence
    assert first is not None
    assert (first.pair, first.left_index, first.right_index) == (1, None, 1)
    assert "get_delivery_date only in the right run" in first.reason


def test_a_skipped_step_is_only_in_the_left_run() -> None:
    left = indexed(call("a"), call("b"), call("c"), answer("x"))
    right = indexed(call("a"), call("c"), answer("x"))
    alignment = align_runs(left, right)
    assert [p.kind for p in alignment.pairs] == ["same", "skipped", "same", "same"]
    first = alignment.first_divergence
    assert first is not None and (first.left_index, first.right_index) == (1, None)


def test_the_same_tool_with_other_arguments_is_changed_with_the_paths() -> None:
    left = indexed(call("lookup_order", order_id="4821", full=True), answer("x"))
    right = indexed(call("lookup_order", order_id="4812", verbose=1), answer("x"))
    alignment = align_runs(left, right)
    assert [p.kind for p in alignment.pairs] == ["changed", "same"]
    (changes,) = alignment.pairs[0].argument_changes
    assert [(c.path, c.op, c.left, c.right) for c in changes] == [
        ("order_id", "changed", "4821", "4812"),
        ("full", "removed", True, None),
        ("verbose", "added", None, 1),
    ]
    first = alignment.first_divergence
    assert first is not None and (first.left_index, first.right_index) == (0, 0)
    assert first.reason.startswith("lookup_order arguments differ (order_id")


def test_a_different_final_answer_is_a_changed_final_step() -> None:
    left = indexed(call("lookup_order", order_id="1"), answer("A replacement ships."))
    right = indexed(call("lookup_order", order_id="1"), answer("We cannot help."))
    alignment = align_runs(left, right)
    assert [p.kind for p in alignment.pairs] == ["same", "changed"]
    assert alignment.pairs[1].reasons == ("final answer differs",)


def test_a_different_observation_of_the_same_call_is_changed() -> None:
    left = indexed(call("refund", status="succeeded", amount=5))
    right = indexed(call("refund", status="denied", amount=5))
    alignment = align_runs(left, right)
    assert alignment.pairs[0].kind == "changed"
    assert alignment.pairs[0].reasons == ("refund succeeded here, denied there",)


def test_in_a_stretch_that_does_not_align_the_same_first_tool_pairs_as_changed() -> (
    None
):
    # Left calls a then b; right calls b (other args) then c: b pairs as
    # changed, a is skipped and c inserted.
    left = indexed(call("a"), call("b", x=1), answer("x"))
    right = indexed(call("b", x=2), call("c"), answer("x"))
    alignment = align_runs(left, right)
    assert [p.kind for p in alignment.pairs] == [
        "skipped", "changed", "inserted", "same",
    ]  # fmt: skip
    assert [c.path for c in alignment.pairs[1].argument_changes[0]] == ["x"]


def test_nested_json_changes_name_their_path() -> None:
    changes = json_changes(
        {"items": [{"sku": "K1", "qty": 1}], "note": "x"},
        {"items": [{"sku": "K2", "qty": 1}, {"sku": "L"}], "note": "x"},
    )
    assert [(c.path, c.op) for c in changes] == [
        ("items[0].sku", "changed"),
        ("items[1]", "added"),
    ]
    # Equal values of different JSON types differ (1 is not true).
    assert [c.path for c in json_changes({"a": 1}, {"a": True})] == ["a"]


def test_one_run_empty_marks_every_step_of_the_other() -> None:
    right = indexed(call("a"), answer("x"))
    assert kinds([], right) == ["inserted", "inserted"]
    assert kinds(right, []) == ["skipped", "skipped"]
