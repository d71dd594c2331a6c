"""numformer bench mpi / mpi-scaling without mpi4py: one line before anything is measured."""
from __future__ import annotations

import sys

import pytest

from numformer.bench import mpi, mpi_scaling


def _measured(*args, **kwargs):
    raise AssertionError("measured without mpi4py")


@pytest.mark.parametrize("part, module", [("mpi", mpi), ("mpi-scaling", mpi_scaling)])
def test_the_mpi_parts_need_mpi4py_before_measuring(monkeypatch, part, module):
    monkeypatch.setitem(sys.modules, "mpi4py", None)          # import mpi4py raises ImportError
    monkeypatch.setattr(module, "ForkedTrainer", _measured)
    monkeypatch.setattr(module, "MPIJob", _measured)
    with pytest.raises(ValueError, match=rf'^numformer bench {part} needs mpi4py and the mpich wheel, whose mpiexec it '
                                         rf'uses: pip install -e "\.\[mpi\]" in numformer\'s checkout'):
        module.run(quick=True)


def test_one_warm_up_step_is_singular():
    result = {"config": "configs/shakespeare_char.toml", "batch": 12, "block_size": 64, "cores": 2, "ranks": 2,
              "forked_processes": 2, "rounds": 3, "steps_per_round": 3, "warmup": 1, "forked_median_tokens_per_s": 1.0,
              "mpi_median_tokens_per_s": 1.0, "median_ratio": 1.0, "min_ratio": 1.0, "max_ratio": 1.0,
              "combine_ms": 1.0, "load_average_before": [0.1] * 3, "load_average_after": [0.1] * 3}
    text = mpi.markdown(result, None)
    assert "after 1 warm-up step." in text and "warm-up steps" not in text
