// Renders chat requests with llama.cpp's own chat layer, the way llama-server's
// POST /apply-template does (oaicompat_chat_params_parse's template part, default
// server options: jinja, prefill_assistant, enable_thinking, reasoning_format deepseek).
// usage: oracle TEMPLATE.jinja BOS EOS REQUESTS.json  -> one JSON line per request
#include "chat.h"
#include <fstream>
#include <iostream>
#include <sstream>
using json = common_json;
static std::string slurp(const char *p) { std::ifstream f(p, std::ios::binary); std::stringstream s; s << f.rdbuf(); return s.str(); }
template <typename T> static T jv(const json &b, const std::string &k, const T &d) {
    if (b.contains(k) && !b.at(k).is_null()) { try { return b.at(k).get<T>(); } catch (...) { return d; } } return d; }
int main(int argc, char **argv) {
    if (argc != 5) return 2;
    std::string src = slurp(argv[1]);
    auto tmpls = common_chat_templates_init(nullptr, src, argv[2], argv[3]);
    json reqs = json::parse(slurp(argv[4]));
    for (size_t i = 0; i < reqs.size(); i++) {
        json body = reqs.at(i), out = json::object();
        try {
            json tools = body.contains("tools") ? body.at("tools") : json();
            std::string tool_choice = jv(body, "tool_choice", std::string("auto"));
            json &messages = body.at("messages");
            for (auto &msg : messages) {
                std::string role = jv(msg, "role", std::string());
                if (role != "assistant" && !msg.contains("content")) throw std::invalid_argument("All non-assistant messages must contain 'content'");
                if (role == "assistant" && !msg.contains("content") && !msg.contains("tool_calls")) throw std::invalid_argument("Assistant message must contain either 'content' or 'tool_calls'!");
            }
            common_chat_templates_inputs inputs;
            inputs.messages = common_chat_msgs_parse_oaicompat(messages);
            inputs.tools = common_chat_tools_parse_oaicompat(tools);
            inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(tool_choice);
            inputs.use_jinja = true;
            inputs.add_generation_prompt = jv(body, "add_generation_prompt", true);
            inputs.continue_final_message = body.contains("continue_final_message") ? common_chat_continuation_parse(body.at("continue_final_message")) : COMMON_CHAT_CONTINUATION_NONE;
            if (inputs.continue_final_message == COMMON_CHAT_CONTINUATION_NONE && !inputs.messages.empty() && inputs.messages.back().role == "assistant") {
                if (inputs.messages.size() >= 2 && inputs.messages[inputs.messages.size() - 2].role == "assistant") throw std::invalid_argument("Cannot have 2 or more assistant messages at the end of the list.");
                inputs.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
                inputs.add_generation_prompt = false;
            }
            if (inputs.continue_final_message != COMMON_CHAT_CONTINUATION_NONE && inputs.add_generation_prompt) throw std::invalid_argument("Cannot set both add_generation_prompt and continue_final_message to true.");
            if (inputs.continue_final_message != COMMON_CHAT_CONTINUATION_NONE && !inputs.messages.empty() && inputs.messages.back().role == "assistant" && !inputs.messages.back().tool_calls.empty()) throw std::invalid_argument("Cannot continue an assistant message that contains tool calls.");
            inputs.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
            inputs.enable_thinking = true;
            json kw = body.contains("chat_template_kwargs") ? body.at("chat_template_kwargs") : json::object();
            for (const auto &[k, v] : kw.items()) inputs.chat_template_kwargs[k] = v.dump();
            if (inputs.chat_template_kwargs.count("enable_thinking")) {
                std::string e = inputs.chat_template_kwargs["enable_thinking"];
                if (e == "true") inputs.enable_thinking = true; else if (e == "false") inputs.enable_thinking = false;
                else if (!e.empty() && e[0] == '"') throw std::invalid_argument("invalid type for \"enable_thinking\" (expected boolean, got string)");
            }
            if (body.contains("reasoning_effort")) {
                std::string re = jv(body, "reasoning_effort", std::string(""));
                if (re == "none") { inputs.enable_thinking = false; inputs.chat_template_kwargs.erase("reasoning_effort"); }
                else if (!re.empty()) inputs.chat_template_kwargs["reasoning_effort"] = json(re).dump();
            }
            auto p = common_chat_templates_apply(tmpls.get(), inputs);
            out["prompt"] = p.prompt;
        } catch (const std::exception &e) {
            out["error"] = std::string(e.what());
        }
        std::cout << out.dump() << "\n";
    }
}
