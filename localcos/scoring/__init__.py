"""Scoring texts over the one scorer (`runtime.scoring`), for `localcos score`: a text's
perplexity (`perplexity`; bits per byte at the byte level, `bytescore`), multiple-choice accuracy
(`choices`), and grids of parameters scored on the same logits (`sweep`); for the combination r
and each model alone."""
