"""`rsched run cron`: a cron job fired once per tick across runners."""
