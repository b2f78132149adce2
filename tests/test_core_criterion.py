"""label_smoothed_cross_entropy_pr: the λ‖P‖² penalty and the row-norm statistics."""

from __future__ import annotations

import torch
from fairseq import options, tasks

from fairseq_tying.common import PLUGIN_DIR
from tests.helpers import TINY_MODEL


def _setup(data, *flags):
    import fairseq_tying  # noqa: F401

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data), "--user-dir", PLUGIN_DIR, "--arch", "transformer_twwt", *TINY_MODEL,
        "--criterion", "label_smoothed_cross_entropy_pr", "--label-smoothing", "0.1", *flags])
    task = tasks.setup_task(args)
    return task.build_model(args), task.build_criterion(args), task


def _sample(task):
    d = task.target_dictionary
    tokens = torch.tensor([[5, 6, 7, d.eos()], [8, 9, 10, d.eos()]])
    prev = torch.cat([torch.full((2, 1), d.eos()), tokens[:, :-1]], 1)
    return {"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([4, 4]),
                          "prev_output_tokens": prev},
            "target": tokens, "ntokens": 8}


def test_projection_penalty_is_lambda_times_squared_frobenius_norm(joined_bin):
    model, criterion, task = _setup(joined_bin, "--tied-projection", "--projection-reg", "0.3")
    sample = _sample(task)
    model.train()
    torch.manual_seed(0)
    loss, sample_size, log = criterion(model, sample)
    criterion.projection_reg = 0.0
    torch.manual_seed(0)
    plain, _, _ = criterion(model, sample)
    p = model.decoder.scorer.projection.weight
    expected = 0.3 * (p.detach() ** 2).sum()
    torch.testing.assert_close(loss - plain, expected * sample_size)
    torch.testing.assert_close(torch.tensor(log["proj_reg"]), expected)
    model.eval()  # validation loss carries no penalty
    criterion.projection_reg = 0.3
    val, _, val_log = criterion(model, sample)
    assert "proj_reg" not in val_log
    criterion.projection_reg = 0.0
    torch.testing.assert_close(criterion(model, sample)[0], val)


def test_row_norm_statistics_skip_the_padding_row(joined_bin):
    model, criterion, task = _setup(joined_bin, "--output-layer", "l2norm")
    _, _, log = criterion(model, _sample(task))
    w = model.decoder.scorer.weight.detach()
    norms = torch.cat([w[:1], w[2:]]).norm(dim=-1)  # padding index 1
    assert task.target_dictionary.pad() == 1
    for key, want in (("wnorm_mean", norms.mean()), ("wnorm_std", norms.std()),
                      ("wnorm_min", norms.min()), ("wnorm_max", norms.max())):
        assert abs(log[key] - want.item()) < 1e-5, key
    assert log["wnorm_min"] > 0  # the zero padding row is not counted
