"""Picking tokens from logits: sampling, logit adjustments, log-probabilities and
speculative drafts."""
