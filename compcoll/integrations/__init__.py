"""Integrations with frameworks that wrap the model for the user: Hugging Face's Trainer and Accelerate."""
