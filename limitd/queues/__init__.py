"""The queue model: what each queue's limits, rate, pause state and order are, as stored
in Redis. The config applies it, the admin API and the command line change it, and the
fetch obeys it, so it sits below all three."""
