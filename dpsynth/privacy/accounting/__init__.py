"""Privacy accounting: what was applied and what it proves.

- `events`: frozen, typed mechanism events (one class per mechanism) and their ledger JSON;
- `compose`: the ε upper bound of composed events (PRV, with an RDP fallback);
- `prv`, `prv_mesh`, `rdp`: the accountants' numerics;
- `calibration`: the noise that meets a target ε;
- `plan`, `plan_check`, `marginal_plan`: a run's plan, fixed before the data is read, and its
  checks.

The bottom of `dpsynth.privacy` (releases → mechanisms → accounting): nothing here imports a
mechanism or a release; a mechanism builds its own events from `events`.
"""
