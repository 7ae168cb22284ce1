"""specdemo: speculative decoding made visible (REST, S4C, SDSAT, prompt lookup) on one lossless tree engine."""
__version__ = "0.1.0"
