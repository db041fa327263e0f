"""Exact resume inside trainers: Lightning, Accelerate, the HF Trainer, torchtitan.

- :mod:`~datapipes.integrations.trainers`: Lightning and Accelerate;
- :mod:`~datapipes.integrations.hf_trainer`: the Hugging Face ``Trainer``;
- :mod:`~datapipes.integrations.torchtitan`: torchtitan's checkpointer.

May import: nodes, datapipes.loader, datapipes.resume.
"""
