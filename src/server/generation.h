// One API request in flight: it fans out into n engine requests per prompt ("choices"), turns their token
// outputs into text (streaming detokenizer, stop strings held back and cut, reasoning and tool-call parsers)
// and writes the OpenAI / SGLang response, streamed or whole. Outputs arrive on the engine thread; the
// responder is thread-safe, so nothing here blocks.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "http/responder.h"
#include "scheduler/engine.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/text.h"

namespace moeserve::server {

struct ServerContext {
  Engine* engine = nullptr;
  const TextLayer* text = nullptr;
  Metrics* metrics = nullptr;
  ParseContext parse;
  std::string reasoning_parser, tool_call_parser;
  std::atomic<uint64_t> next_id{1};
  uint64_t default_seed = 0;
};

// Submits the request's choices and answers through `responder` when they finish (or as they stream).
// Throws ApiError / UserError before anything was submitted when the request cannot run.
void start_generation(ServerContext& ctx, ApiRequest req, std::shared_ptr<http::Responder> responder);

}  // namespace moeserve::server
