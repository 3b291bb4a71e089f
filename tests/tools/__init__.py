"""Tests for the developer tools."""
