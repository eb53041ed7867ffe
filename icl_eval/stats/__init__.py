"""What records become: label baselines, bootstrap intervals, summaries, spread over orders."""
