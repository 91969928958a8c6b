// A reply parser that is one state machine for whole and streamed text. It only ever decides on
// text it has fully seen: when the end of the buffer could still be the start of a tag, that end
// waits for the next chunk. So every chunking reaches the same decisions at the same places, and
// parse_reply() is just feed() + finish().
#include "chat/parse.h"

#include <algorithm>
#include <array>
#include <set>
#include <utility>

namespace qwenrt::chat {
namespace {

constexpr std::string_view kWhitespace = " \t\n\r\f\v";
// A function or parameter name longer than this, or one holding '<' or a newline, means the tag
// was not a tag after all.
constexpr size_t kMaxNameLength = 256;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";

// Tags that interrupt reasoning or content.
constexpr std::array<std::string_view, 4> kTextTags = {kThinkClose, kCallOpen, kFunctionOpen,
                                                       kThinkOpen};
// Tags that may end a parameter value: each is a candidate, decided by what follows it.
constexpr std::array<std::string_view, 4> kValueEnds = {kParamClose, kParamOpen, kFunctionClose,
                                                        kCallClose};
// Tags expected between parameters.
constexpr std::array<std::string_view, 6> kBodyTags = {kParamOpen, kParamClose, kFunctionClose,
                                                       kCallClose, kCallOpen,   kFunctionOpen};

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

template <size_t N>
std::pair<size_t, std::string_view> find_first(std::string_view text,
                                               const std::array<std::string_view, N>& tags) {
  std::pair<size_t, std::string_view> best{std::string_view::npos, {}};
  for (const std::string_view tag : tags) {
    const size_t pos = text.find(tag);
    if (pos < best.first) best = {pos, tag};
  }
  return best;
}

// Length of the longest end of `text` that is the start of some tag (and so must wait).
template <size_t N>
size_t held_suffix(std::string_view text, const std::array<std::string_view, N>& tags) {
  size_t longest_tag = 0;
  for (const std::string_view tag : tags) longest_tag = std::max(longest_tag, tag.size());
  for (size_t length = std::min(text.size(), longest_tag - 1); length > 0; --length) {
    const std::string_view end = text.substr(text.size() - length);
    for (const std::string_view tag : tags) {
      if (starts_with(tag, end)) return length;
    }
  }
  return 0;
}

// The text is a proper start of one of the tags (more text could complete it).
template <size_t N>
bool is_tag_prefix(std::string_view text, const std::array<std::string_view, N>& tags) {
  for (const std::string_view tag : tags) {
    if (text.size() < tag.size() && starts_with(tag, text)) return true;
  }
  return false;
}

// Bytes at the end of `text` that begin a UTF-8 sequence the text does not finish.
size_t incomplete_utf8_tail(std::string_view text) {
  for (size_t back = 1; back <= std::min<size_t>(4, text.size()); ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
    return length > back ? back : 0;
  }
  return 0;
}

std::string_view skip_whitespace(std::string_view text) {
  return text.substr(std::min(text.find_first_not_of(kWhitespace), text.size()));
}

// A value's text as the inside of its JSON string (nlohmann's escaping, character by character,
// so the pieces of a string escape to the pieces of its escaping).
std::string json_string_body(std::string_view text) {
  const std::string quoted =
      Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

std::string dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string_view strip_ascii(std::string_view text) {
  const size_t begin = text.find_first_not_of(kWhitespace);
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(kWhitespace) - begin + 1);
}

// Removes leading ASCII whitespace from buffer; returns the removed text.
std::string take_whitespace(std::string& buffer) {
  const size_t end = std::min(buffer.find_first_not_of(kWhitespace), buffer.size());
  std::string taken = buffer.substr(0, end);
  buffer.erase(0, end);
  return taken;
}

void collect_types(const Json& schema, std::set<std::string>& types) {
  if (!schema.is_object()) return;
  if (const auto type = schema.find("type"); type != schema.end()) {
    if (type->is_string()) types.insert(type->get<std::string>());
    if (type->is_array()) {
      for (const Json& item : *type) {
        if (item.is_string()) types.insert(item.get<std::string>());
      }
    }
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (const auto options = schema.find(key); options != schema.end() && options->is_array()) {
      for (const Json& option : *options) collect_types(option, types);
    }
  }
}

bool matches_type(const Json& value, const std::set<std::string>& types) {
  return (types.count("integer") && (value.is_number_integer() || value.is_number_unsigned())) ||
         (types.count("number") && value.is_number()) ||
         (types.count("boolean") && value.is_boolean()) ||
         (types.count("object") && value.is_object()) ||
         (types.count("array") && value.is_array()) || (types.count("null") && value.is_null());
}

}  // namespace

ReplyParser::ReplyParser(const ReplyParserOptions& options)
    : mode_(options.starts_in_reasoning ? Mode::kReasoning : Mode::kContent) {
  if (!options.tools.is_array()) return;
  for (const Json& tool : options.tools) {
    if (!tool.is_object()) continue;
    const auto function_it = tool.find("function");
    const Json& function = function_it != tool.end() ? *function_it : tool;
    if (!function.is_object() || !function.contains("name") || !function["name"].is_string()) {
      continue;
    }
    const auto parameters = function.find("parameters");
    if (parameters == function.end() || !parameters->is_object()) continue;
    const auto properties = parameters->find("properties");
    if (properties == parameters->end() || !properties->is_object()) continue;
    schemas_[function["name"].get<std::string>()] = *properties;
  }
}

std::vector<ReplyEvent> ReplyParser::feed(std::string_view text) {
  buffer_.append(text);
  while (step(/*final=*/false)) {
  }
  return std::exchange(events_, {});
}

std::vector<ReplyEvent> ReplyParser::finish() {
  while (step(/*final=*/true)) {
  }
  return std::exchange(events_, {});
}

bool ReplyParser::step(bool final) {
  return mode_ == Mode::kCall ? step_call(final) : step_text(final);
}

bool ReplyParser::step_text(bool final) {
  if (skip_ws_) {
    take_whitespace(buffer_);
    if (buffer_.empty()) return false;
    skip_ws_ = false;
  }
  const Mode mode = mode_;
  const auto [pos, tag] = find_first(buffer_, kTextTags);
  if (pos != std::string::npos) {
    write_text(mode, std::string_view(buffer_).substr(0, pos));
    buffer_.erase(0, pos + tag.size());
    if (tag == kThinkClose) {
      // Closing the think block (a stray one in content is dropped).
      if (mode == Mode::kReasoning) {
        reasoning_.pending_ws.clear();
        mode_ = Mode::kContent;
      }
    } else if (tag == kThinkOpen) {
      // Inside the think block a repeated opener means nothing; before any content it means the
      // model is thinking although the prompt did not ask it to; later it is just text.
      if (mode == Mode::kContent) {
        if (!content_.started && result_.tool_calls.empty()) {
          mode_ = Mode::kReasoning;
        } else {
          write_text(mode, kThinkOpen);
        }
      }
    } else {
      call_raw_ = std::string(tag);
      begin_call(/*explicit_open=*/tag == kCallOpen);
    }
    return true;
  }
  size_t ready = buffer_.size();
  if (!final) {
    ready -= held_suffix(buffer_, kTextTags);
    ready -= incomplete_utf8_tail(std::string_view(buffer_).substr(0, ready));
  }
  write_text(mode, std::string_view(buffer_).substr(0, ready));
  buffer_.erase(0, ready);
  return false;
}

bool ReplyParser::step_call(bool final) {
  switch (stage_) {
    case CallStage::kOpen: {
      call_raw_ += take_whitespace(buffer_);
      if (starts_with(buffer_, kFunctionOpen)) {
        call_raw_ += kFunctionOpen;
        buffer_.erase(0, kFunctionOpen.size());
        stage_ = CallStage::kName;
        return true;
      }
      if (starts_with(buffer_, kCallOpen)) {  // a doubled <tool_call>
        call_raw_ += kCallOpen;
        buffer_.erase(0, kCallOpen.size());
        return true;
      }
      if (buffer_.empty() || is_tag_prefix(buffer_, std::array{kFunctionOpen, kCallOpen})) {
        if (!final) return false;
        buffer_.clear();
        end_call(/*complete=*/false);
        return true;
      }
      malformed_call();
      return true;
    }
    case CallStage::kName: {
      const size_t end = buffer_.find('>');
      const std::string_view name = std::string_view(buffer_).substr(0, end);
      if (name.find_first_of("<\n") != std::string_view::npos || name.size() > kMaxNameLength) {
        malformed_call();
        return true;
      }
      if (end == std::string::npos) {
        if (!final) return false;
        call_.name = std::string(strip_ascii(name));
        buffer_.clear();
        end_call(/*complete=*/false);
        return true;
      }
      if (strip_ascii(name).empty()) {
        malformed_call();
        return true;
      }
      call_.name = std::string(strip_ascii(name));
      buffer_.erase(0, end + 1);
      call_raw_.clear();
      stage_ = CallStage::kBody;
      ReplyEvent begin{.kind = ReplyEvent::Kind::kToolCallBegin,
                       .tool_index = result_.tool_calls.size()};
      begin.call.name = call_.name;
      push_event(std::move(begin));
      return true;
    }
    case CallStage::kBody: {
      take_whitespace(buffer_);
      for (const std::string_view tag : kBodyTags) {
        if (!starts_with(buffer_, tag)) continue;
        if (tag == kCallOpen || tag == kFunctionOpen) {
          // The next call begins before this one was closed: this one is over.
          end_call(/*complete=*/true);
          return true;
        }
        buffer_.erase(0, tag.size());
        if (tag == kParamOpen) stage_ = CallStage::kParamName;
        if (tag == kFunctionClose) stage_ = CallStage::kClose;
        if (tag == kCallClose) end_call(/*complete=*/true);
        // kParamClose here is a duplicate of the one that ended the last value: skipped.
        return true;
      }
      if (buffer_.empty() || is_tag_prefix(buffer_, kBodyTags)) {
        if (!final) return false;
        buffer_.clear();
        end_call(/*complete=*/false);
        return true;
      }
      // Stray text between parameters is not part of the call: skip to the next tag.
      const size_t next = buffer_.find('<', 1);
      buffer_.erase(0, next == std::string::npos ? buffer_.size() : next);
      return true;
    }
    case CallStage::kParamName: {
      const size_t end = buffer_.find('>');
      const std::string_view name = std::string_view(buffer_).substr(0, end);
      if (name.find_first_of("<\n") != std::string_view::npos || name.size() > kMaxNameLength) {
        stage_ = CallStage::kBody;  // not a parameter tag; its text is skipped as stray text
        return true;
      }
      if (end == std::string::npos) {
        if (!final) return false;
        buffer_.clear();
        end_call(/*complete=*/false);
        return true;
      }
      param_name_ = std::string(strip_ascii(name));
      param_value_.clear();
      param_streamed_ = 0;
      buffer_.erase(0, end + 1);
      stage_ = CallStage::kParamValue;
      // A parameter given twice keeps its first value: the streamed arguments cannot take back
      // what they sent.
      param_ignored_ = call_.arguments.contains(param_name_);
      if (!param_ignored_) {
        param_streams_ = !is_typed(call_.name, param_name_);
        push_args((args_opened_ ? "," : "{") + dump(Json(param_name_)) + ":" +
                  (param_streams_ ? "\"" : ""));
        args_opened_ = true;
      }
      return true;
    }
    case CallStage::kParamValue: {
      // Each candidate end is decided by the text after it; a rejected one is text of the value.
      size_t from = 0;
      for (;;) {
        auto [pos, tag] = find_first(std::string_view(buffer_).substr(from), kValueEnds);
        if (pos == std::string::npos) break;
        pos += from;
        const std::string_view rest = std::string_view(buffer_).substr(pos + tag.size());
        const char before = pos > 0                ? buffer_[pos - 1]
                            : param_value_.empty() ? '>'
                                                   : param_value_.back();
        const Verdict verdict = tag == kParamClose ? after_value_close(rest, final)
                                                   : lenient_value_end(tag, before, rest, final);
        if (verdict == Verdict::kNo) {
          from = pos + 1;
          continue;
        }
        param_value_.append(buffer_, 0, pos);
        buffer_.erase(0, pos);
        if (verdict == Verdict::kUndecided) {
          stream_value(/*final=*/false);
          return false;  // the candidate waits for the text that decides it
        }
        if (tag == kParamClose) buffer_.erase(0, tag.size());
        finish_parameter();
        stage_ = CallStage::kBody;
        return true;
      }
      const size_t ready = buffer_.size() - (final ? 0 : held_suffix(buffer_, kValueEnds));
      param_value_.append(buffer_, 0, ready);
      buffer_.erase(0, ready);
      if (!final) {
        stream_value(/*final=*/false);
        return false;
      }
      finish_parameter();
      end_call(/*complete=*/false);
      return true;
    }
    case CallStage::kClose: {
      take_whitespace(buffer_);
      if (starts_with(buffer_, kCallClose)) {
        buffer_.erase(0, kCallClose.size());
        end_call(/*complete=*/true);
        return true;
      }
      if (buffer_.empty() || is_tag_prefix(buffer_, std::array{kCallClose})) {
        if (!final) return false;
        buffer_.clear();  // </function> was read: the call is whole even if </tool_call> is cut
      }
      // Anything else after </function> (text, the next call) means </tool_call> was left out.
      end_call(/*complete=*/true);
      return true;
    }
  }
  return false;
}

void ReplyParser::write_text(Mode channel, std::string_view text) {
  Channel& state = channel == Mode::kReasoning ? reasoning_ : content_;
  if (!state.started) {
    const size_t begin = text.find_first_not_of(kWhitespace);
    if (begin == std::string_view::npos) return;
    text.remove_prefix(begin);
  }
  if (text.empty()) return;
  const size_t last = text.find_last_not_of(kWhitespace);
  if (last == std::string_view::npos) {
    state.pending_ws.append(text);
    return;
  }
  std::string out = std::exchange(state.pending_ws, std::string(text.substr(last + 1)));
  out.append(text.substr(0, last + 1));
  state.started = true;
  const bool reasoning = channel == Mode::kReasoning;
  (reasoning ? result_.reasoning : result_.content) += out;
  push_event({.kind = reasoning ? ReplyEvent::Kind::kReasoning : ReplyEvent::Kind::kContent,
              .text = std::move(out)});
}

void ReplyParser::begin_call(bool explicit_open) {
  call_return_mode_ = mode_;
  mode_ = Mode::kCall;
  stage_ = explicit_open ? CallStage::kOpen : CallStage::kName;
  call_ = ToolCall{};
  args_opened_ = false;
}

void ReplyParser::end_call(bool complete) {
  push_args(args_opened_ ? "}" : "{}");
  args_opened_ = false;
  call_.complete = complete;
  const size_t index = result_.tool_calls.size();
  result_.tool_calls.push_back(call_);
  push_event({.kind = ReplyEvent::Kind::kToolCall, .tool_index = index, .call = std::move(call_)});
  call_ = ToolCall{};
  call_raw_.clear();
  mode_ = call_return_mode_;
  skip_ws_ = true;
}

void ReplyParser::malformed_call() {
  // What looked like the start of a call is not one: it goes back to the text it interrupted.
  mode_ = call_return_mode_;
  write_text(mode_, call_raw_);
  call_raw_.clear();
}

void ReplyParser::finish_parameter() {
  if (!param_ignored_) {
    stream_value(/*final=*/true);
    // The template writes "<parameter=P>\n" + value + "\n</parameter>": one newline on each side
    // belongs to the format, not to the value.
    std::string_view value = param_value_;
    if (starts_with(value, "\n")) value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    Json coerced = coerce(call_.name, param_name_, std::string(value));
    push_args(param_streams_ ? "\"" : dump(coerced));
    call_.arguments[param_name_] = std::move(coerced);
  }
  param_value_.clear();
  param_streamed_ = 0;
  param_ignored_ = false;
}

void ReplyParser::stream_value(bool final) {
  // Streams the part of a string value that can no longer change: not the format's newline at
  // the start, not a last newline (it is the format's if the value ends there), not an
  // unfinished UTF-8 sequence.
  if (param_ignored_ || !param_streams_ || param_value_.empty()) return;
  const std::string_view value = param_value_;
  const size_t begin = std::max<size_t>(param_streamed_, value[0] == '\n' ? 1 : 0);
  size_t end = value.size();
  if (end > begin && value.back() == '\n') --end;
  if (!final) end -= incomplete_utf8_tail(value.substr(0, end));
  if (end <= begin) return;
  push_args(json_string_body(value.substr(begin, end - begin)));
  param_streamed_ = end;
}

bool ReplyParser::may_come_next(std::string_view name) const {
  const std::string key(name);
  if (key == param_name_ || call_.arguments.contains(key)) return false;
  const auto schema = schemas_.find(call_.name);
  return schema == schemas_.end() || schema->second.contains(key);
}

ReplyParser::Verdict ReplyParser::next_parameter(std::string_view rest, bool final) const {
  // `rest` follows "<parameter=": a name that may come next, then '>'.
  const size_t end = rest.find('>');
  const std::string_view name = rest.substr(0, end);
  if (name.find_first_of("<\n") != std::string_view::npos || name.size() > kMaxNameLength) {
    return Verdict::kNo;
  }
  if (end == std::string_view::npos) return final ? Verdict::kYes : Verdict::kUndecided;
  return may_come_next(strip_ascii(name)) ? Verdict::kYes : Verdict::kNo;
}

ReplyParser::Verdict ReplyParser::after_call_close(std::string_view rest, bool final) {
  // After a call anything may follow but a tag that only occurs inside a call: then the closing
  // tag was text of a value of an outer call.
  constexpr std::array<std::string_view, 4> kInside = {kParamClose, kParamOpen, kFunctionClose,
                                                       kCallClose};
  rest = skip_whitespace(rest);
  if (rest.empty()) return final ? Verdict::kYes : Verdict::kUndecided;
  for (const std::string_view tag : kInside) {
    if (starts_with(rest, tag)) return Verdict::kNo;
  }
  return !final && is_tag_prefix(rest, kInside) ? Verdict::kUndecided : Verdict::kYes;
}

ReplyParser::Verdict ReplyParser::after_function_close(std::string_view rest, bool final) {
  // After </function> comes </tool_call> (then what may follow a call), or the call was left
  // unclosed and anything but a tag of a call's inside may follow.
  constexpr std::array<std::string_view, 4> kInside = {kParamClose, kParamOpen, kFunctionClose,
                                                       kCallClose};
  rest = skip_whitespace(rest);
  if (starts_with(rest, kCallClose)) return after_call_close(rest.substr(kCallClose.size()), final);
  if (rest.empty() || (!final && is_tag_prefix(rest, kInside))) {
    return final ? Verdict::kYes : Verdict::kUndecided;
  }
  for (const std::string_view tag : {kParamClose, kParamOpen, kFunctionClose}) {
    if (starts_with(rest, tag)) return Verdict::kNo;
  }
  return Verdict::kYes;
}

ReplyParser::Verdict ReplyParser::after_value_close(std::string_view rest, bool final) const {
  // `rest` follows a "</parameter>".
  rest = skip_whitespace(rest);
  if (rest.empty()) return final ? Verdict::kYes : Verdict::kUndecided;
  if (starts_with(rest, kParamClose)) {  // duplicated: decided by what follows the last one
    return after_value_close(rest.substr(kParamClose.size()), final);
  }
  if (starts_with(rest, kParamOpen)) return next_parameter(rest.substr(kParamOpen.size()), final);
  if (starts_with(rest, kFunctionClose)) {
    return after_function_close(rest.substr(kFunctionClose.size()), final);
  }
  if (starts_with(rest, kCallClose)) return after_call_close(rest.substr(kCallClose.size()), final);
  // The reply ended inside the next tag.
  if (is_tag_prefix(rest, kValueEnds)) return final ? Verdict::kYes : Verdict::kUndecided;
  return Verdict::kNo;
}

ReplyParser::Verdict ReplyParser::lenient_value_end(std::string_view tag, char before,
                                                    std::string_view rest, bool final) const {
  // The model left out </parameter>: the next tag ends the value only where the format puts it,
  // on a line of its own, and followed as the format has it.
  if (before != '\n') return Verdict::kNo;
  if (tag == kFunctionClose) return after_function_close(rest, final);
  if (tag == kCallClose) return after_call_close(rest, final);
  const Verdict name = next_parameter(rest, final);
  if (name != Verdict::kYes) return name;
  const size_t end = rest.find('>');
  if (end == std::string_view::npos) return Verdict::kYes;  // final: the reply ended in the tag
  if (end + 1 == rest.size()) return final ? Verdict::kYes : Verdict::kUndecided;
  return rest[end + 1] == '\n' ? Verdict::kYes : Verdict::kNo;
}

bool ReplyParser::is_typed(const std::string& function, const std::string& parameter) const {
  const auto schema = schemas_.find(function);
  if (schema == schemas_.end() || !schema->second.contains(parameter)) return false;
  std::set<std::string> types;
  collect_types(schema->second[parameter], types);
  types.erase("string");
  return !types.empty();
}

Json ReplyParser::coerce(const std::string& function, const std::string& parameter,
                         std::string raw) const {
  // Without a schema for the parameter there is no telling "42" the id from 42 the count: keep the
  // text. A string-typed parameter is always the text.
  const auto schema = schemas_.find(function);
  if (schema == schemas_.end() || !schema->second.contains(parameter)) return raw;
  std::set<std::string> types;
  collect_types(schema->second[parameter], types);
  types.erase("string");
  if (types.empty()) return raw;
  const std::string_view text = strip_ascii(raw);
  // The 3.5 template writes booleans and null from Python ("True", "None") into the history, so
  // the model may write them back that way.
  if (types.count("boolean") && (text == "true" || text == "True")) return true;
  if (types.count("boolean") && (text == "false" || text == "False")) return false;
  if (types.count("null") && (text == "null" || text == "None")) return nullptr;
  Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_discarded() && matches_type(parsed, types)) return parsed;
  return raw;
}

void ReplyParser::push_args(std::string text) {
  push_event({.kind = ReplyEvent::Kind::kToolCallArgs,
              .text = std::move(text),
              .tool_index = result_.tool_calls.size()});
}

void ReplyParser::push_event(ReplyEvent event) {
  const bool mergeable = event.kind == ReplyEvent::Kind::kReasoning ||
                         event.kind == ReplyEvent::Kind::kContent ||
                         event.kind == ReplyEvent::Kind::kToolCallArgs;
  if (mergeable && !events_.empty() && events_.back().kind == event.kind &&
      events_.back().tool_index == event.tool_index) {
    events_.back().text += event.text;
    return;
  }
  events_.push_back(std::move(event));
}

ParsedReply parse_reply(std::string_view text, const ReplyParserOptions& options) {
  ReplyParser parser(options);
  parser.feed(text);
  parser.finish();
  return parser.result();
}

}  // namespace qwenrt::chat
