"""What several tests share: Redis servers of their own, child programs, worker apps, rigs."""
