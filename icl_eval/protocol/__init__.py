"""The many-shot protocol: draws, budgets, label maps, orders, nearest arms, units over ranks."""
