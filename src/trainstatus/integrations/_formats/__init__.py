"""The checkpoint formats the integrations check from their metadata alone, never their weights: a
safetensors header (``safetensors``), ``torch.save``'s zip archive (``torch_zip``) and a
``torch.distributed.checkpoint`` folder's ``.metadata`` (``dcp_metadata``)."""
