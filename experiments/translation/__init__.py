"""kvtranslate's studies, benchmarks and report (results in experiments/results/kvtranslate/). Named apart from the
`kvtranslate` package so that neither shadows the other on import."""
