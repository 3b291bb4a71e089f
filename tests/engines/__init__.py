"""Tests for the gRPC engine protocol clients, against the scripted engine as a real process."""
