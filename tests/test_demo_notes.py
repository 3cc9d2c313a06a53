"""The demo's reference table explains why EAGLE-3 is (or is not) faster than plain decode."""

from __future__ import annotations

from orchestrator.commands.demo import speculation_note
from orchestrator.targets.sim import model
from orchestrator.targets.sim.gpu_state import default_state

EAGLE3 = model.LaunchConfig(tp_size=8, speculative_algorithm="EAGLE3", speculative_num_steps=2,
                            speculative_eagle_topk=1, speculative_num_draft_tokens=3)


def test_the_note_states_the_break_even_arithmetic_of_the_measured_means():
    """The reference node's means (plain decode 10.35 ms; EAGLE-3 draft 6.4 + verify 18.3 ms
    for 2.38 tokens): about even, and the node's NCCL_PROTO is named as why."""
    note = speculation_note((10.35,), (6.4, 18.3, 2.38), "LL128")
    assert note.startswith("why: an EAGLE-3 cycle (draft 6.4 ms + verify 18.3 ms = 24.7 ms)"
                           " yields 2.38 tokens, which plain decode makes in 2.38 x 10.35 ms ="
                           " 24.6 ms: about even at batch 1")
    assert "NCCL_PROTO=LL128 shortens the target model's all-reduce" in note
    assert speculation_note((None,), (6.4, 18.3, 2.38)) is None  # nothing to explain with


def test_on_the_calibration_node_the_sims_eagle3_is_the_seeds_five_percent_faster():
    """The sim's own noise-free model, default node: the seed's 89 vs 94 tok/s."""
    plain = model.predict(model.LaunchConfig(tp_size=8), {}, default_state())
    eagle = model.predict(EAGLE3, {}, default_state())
    note = speculation_note((plain.decode_ms,), (eagle.draft_ms, eagle.verify_ms,
                                                 eagle.accept_len))
    assert ": EAGLE-3 +5% tokens per second at batch 1" in note and "NCCL" not in note
    assert round(plain.tok_s) == 89 and round(eagle.tok_s) == 94
