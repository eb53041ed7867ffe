"""Recall through the cache (`evalm eval recall`): seeded needle families, token-exact haystacks, exact-match scoring."""
