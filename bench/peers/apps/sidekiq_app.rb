# Ruby Sidekiq's benchmark job (sidekiq -r ./sidekiq_app.rb). Logging at WARN: Sidekiq
# logs a start and a done line per job at INFO.
require "sidekiq"

Sidekiq.configure_server do |config|
  config.logger.level = Logger::WARN
end

class NoopJob
  include Sidekiq::Worker
  sidekiq_options queue: "bench", retry: false

  def perform(_i)
    Sidekiq.redis { |conn| conn.incr("bench:done") }
  end
end
