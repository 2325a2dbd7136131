"""Evaluation tasks over the one scorer (`runtime.scoring`): a text's perplexity and
multiple-choice accuracy, for the combination r and each model alone (`localcos score`)."""
