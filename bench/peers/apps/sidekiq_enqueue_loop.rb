# Enqueue N NoopJob jobs with Ruby Sidekiq's client and print {"seconds": ...} as JSON on
# the last line (run by bench/enqueue_loop.py). Redis comes from REDIS_URL.
#
#   ruby sidekiq_enqueue_loop.rb loop N   # NoopJob.perform_async(i), one push per call
#   ruby sidekiq_enqueue_loop.rb bulk N   # Sidekiq::Client.push_bulk, 1,000 jobs per call
#
# Requires, the arguments and a first connection (a PING through Sidekiq's pool) are done
# before the clock starts: the figure is the enqueue calls alone.
require "sidekiq"
require "json"
require_relative "sidekiq_app"

CHUNK = 1000

def enqueue_loop(n)
  n.times { |i| NoopJob.perform_async(i) }
end

def enqueue_bulk(args)
  args.each_slice(CHUNK) do |chunk|
    Sidekiq::Client.push_bulk("class" => "NoopJob", "queue" => "bench", "args" => chunk)
  end
end

mode = ARGV.fetch(0)
n = Integer(ARGV.fetch(1))
abort("mode must be loop or bulk, not #{mode}") unless %w[loop bulk].include?(mode)
args = mode == "bulk" ? (0...n).map { |i| [i] } : nil
Sidekiq.redis(&:ping)

started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
mode == "loop" ? enqueue_loop(n) : enqueue_bulk(args)
seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
puts JSON.generate({ "seconds" => seconds })
