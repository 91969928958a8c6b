#include "serve/stream_events.h"

#include <utility>

namespace qwenrt::serve {

std::vector<chat::ReplyEvent> StreamEvents::next(const std::vector<chat::ReplyEvent>& events) {
  using K = chat::ReplyEvent::Kind;
  std::vector<chat::ReplyEvent> out;
  auto grow = [this](size_t index) {
    if (begun_.size() <= index) {
      begun_.resize(index + 1, false);
      held_args_.resize(index + 1);
    }
  };
  auto append = [&out](K kind, size_t index, const std::string& text) {
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == kind && out.back().tool_index == index) {
      out.back().text += text;
      return;
    }
    out.push_back({.kind = kind, .text = text, .tool_index = index});
  };
  for (const auto& e : events) {
    switch (e.kind) {
      case K::kReasoning:
      case K::kContent:
        append(e.kind, 0, e.text);
        break;
      case K::kToolCallBegin:
        grow(e.tool_index);
        begun_[e.tool_index] = true;
        out.push_back(e);
        append(K::kToolCallArgs, e.tool_index, std::exchange(held_args_[e.tool_index], {}));
        break;
      case K::kToolCallArgs:
        grow(e.tool_index);
        // A call cut off inside its name sends its "{}" before (and without) a name: it waits
        // for the call's end, which has the name read so far.
        if (!begun_[e.tool_index])
          held_args_[e.tool_index] += e.text;
        else
          append(K::kToolCallArgs, e.tool_index, e.text);
        break;
      case K::kToolCall:
        grow(e.tool_index);
        if (!begun_[e.tool_index]) {
          begun_[e.tool_index] = true;
          out.push_back({.kind = K::kToolCallBegin, .tool_index = e.tool_index, .call = e.call});
          append(K::kToolCallArgs, e.tool_index, std::exchange(held_args_[e.tool_index], {}));
        }
        out.push_back(e);
        break;
    }
  }
  return out;
}

}  // namespace qwenrt::serve
