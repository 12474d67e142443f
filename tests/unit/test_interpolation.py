"""OmegaConf interpolations in YAML job configs (perfmodel.configs.interpolation), as the NeMo
Framework Launcher resolves them (launcher_scripts/main.py: multiply, divide_ceil, divide_floor;
its training configs mounted under `training`)."""

from __future__ import annotations

from perfmodel.configs.interpolation import resolved


def test_relative_absolute_and_resolver_interpolations_resolve():
    data = {"run": {"name": "gpt3_5b"},
            "model": {"hidden_size": 4096, "ffn_hidden_size": "${multiply:4, ${.hidden_size}}",
                      "pipeline_model_parallel_size": 4, "tensor_model_parallel_size": 2,
                      "split_rank": "${divide_floor:${.pipeline_model_parallel_size}, 3}",
                      "chunks": "${divide_ceil:${.pipeline_model_parallel_size}, 3}",
                      "model_parallel_size":
                          "${multiply:${training.model.tensor_model_parallel_size}, "
                          "${training.model.pipeline_model_parallel_size}}",
                      "name": "${run.name}"}}
    model = resolved(data)["model"]
    assert (model["ffn_hidden_size"], model["split_rank"], model["chunks"],
            model["model_parallel_size"], model["name"]) == (16384, 1, 2, 8, "gpt3_5b")


def test_what_does_not_resolve_stays_as_written():
    data = {"model": {"data": {"data_prefix": [0.5, "${data_dir}/my_text_document"]},
                      "bad": "${multiply:a, ${.missing}}", "seq": 2048}}
    assert resolved(data) == data
    plain = {"model": {"hidden_size": 4096}}
    assert resolved(plain) is plain  # nothing to resolve: omegaconf is not needed
