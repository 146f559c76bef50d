# Enqueue N NoopJob jobs with Sidekiq::Client.push_bulk, 1,000 per call (one LPUSH each),
# and print the seconds it took as JSON. Redis comes from REDIS_URL.
require "sidekiq"
require "json"

n = Integer(ARGV.fetch(0))
args = (0...n).map { |i| [i] }
started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
args.each_slice(1000) do |chunk|
  Sidekiq::Client.push_bulk("class" => "NoopJob", "queue" => "bench", "args" => chunk)
end
seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
puts JSON.generate({ "seconds" => seconds })
