"""Compressed collectives, each written once against Communicator and the codecs."""
