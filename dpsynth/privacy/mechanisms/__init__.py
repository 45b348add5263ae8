"""Privacy mechanisms: the code that reads private data and adds calibrated noise.

Per-record clipping (`per_record`), DP-SGD (`dpsgd`, its distributed form `distributed`),
ghost clipping (`ghost`, `ghost_layers`, `ghost_check`), the functional mechanism
(`functional`), DPAF's forward aggregation (`aggregation`), sparse histograms (`histograms`),
marginal measurements (`marginal_measure`), the exponential mechanism (`selection`), and the
run's secret randomness (`randomness`).
"""
