"""The models alone: the exhaustive model explorer and the spec pages generated from them."""
