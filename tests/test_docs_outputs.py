"""Every sample output of README.md and docs/*.md (a block that starts ``$ COMMAND``) is what the
command prints today: each command runs once, from the 1-rank run, and its output is compared with
the sample (tests/_docs.py says how: ``...`` for lines or text that differ between machines)."""
from __future__ import annotations

import pytest
from mpi4py import MPI

from _docs import samples, matches, run

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1, reason="runs its own mpirun jobs once")]

SAMPLES = samples()


def test_samples_found():
    assert len(SAMPLES) >= 15, [s.id for s in SAMPLES]


@pytest.mark.timeout_s(300)
@pytest.mark.parametrize("sample", SAMPLES, ids=[s.id for s in SAMPLES])
def test_sample_output(sample):
    status, out = run(sample.block)[sample.index]
    assert not isinstance(status, str), f"{sample.id}: $ {sample.command}: {status}\n{out[-3000:]}"
    if not matches(sample, out):
        pytest.fail(f"{sample.id}: $ {sample.command} (exit status {status}) printed what its sample in the page "
                    f"does not show.\n--- the page shows:\n" + "\n".join(sample.expected) +
                    f"\n--- the command printed:\n{out}", pytrace=False)
