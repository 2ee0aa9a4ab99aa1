"""The Redis store: its wire, its layout and indexes, and what a lost or late reply does."""
