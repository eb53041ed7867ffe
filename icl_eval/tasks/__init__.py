"""Tasks and their data: the built-in tasks and task files, their splits, task folders, the synthetic family, prompts."""
