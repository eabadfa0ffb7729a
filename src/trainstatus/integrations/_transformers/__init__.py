"""The helpers of ``trainstatus.integrations.transformers``, beside it."""
