"""Real servers the gateway works with (PostgreSQL, Redis), started in temp dirs on free loopback ports."""
