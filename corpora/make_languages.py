"""Write `languages.jsonl`: one short story told in eleven languages, and two small Python functions.

A sample for comparing tokenizers across scripts (`tk eval -t TOK --by-language
corpora/languages.jsonl`): the same story in each language, so that the bytes and tokens each
language takes compare. One JSON object per line, each paragraph its own document:
{"lang": "en", "name": "English", "text": "..."}. Languages: English (en), German (de), French
(fr), Spanish (es), Russian (ru), Greek (el), Arabic (ar), Hindi (hi), Chinese (zh, simplified),
Japanese (ja), Korean (ko); and Python code (python).

How it was made: the story was written for this project in the manner of the default corpus
(corpora/make_tiny_tales.py: a fox finds a ball, asks around on Monday, and gives it back to its
owner on Tuesday), and then translated into each language for this project, by the same author,
with no text copied from any source. The Python functions were written for it too. The
translations aim at plain, correct language a child's book would use; they are not the work of
native speakers, and a few names are spelled as each language spells them (Max, Lily).

Licence: the texts of this file and of languages.jsonl are dedicated to the public domain under
CC0 1.0 (https://creativecommons.org/publicdomain/zero/1.0/): anyone may copy, change and use
them, for any purpose, without asking and without attribution.

    python corpora/make_languages.py            # rewrites corpora/languages.jsonl
    python corpora/make_languages.py -o -       # prints it
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# (lang, name, paragraphs), each paragraph one document
STORIES = [
    (
        "en",
        "English",
        [
            "Once upon a time, there was a kind fox named Max. He lived in a small house near the river. "
            "Every day, Max liked to sing songs by the water. On Monday, it rained all morning, so Max stayed "
            "inside and drank warm milk. In the afternoon the sun came out, and Max went for a walk along the "
            'river. Under an old tree, he found a red ball. "What a lovely ball!" said Max. He did not know '
            "whose ball it was, so he asked the birds, the frogs and the fish. Nobody knew.",
            "On Tuesday, Max took the ball to his friend Lily the rabbit. Lily laughed and said that it was "
            "her ball: she had lost it a week ago, on the day of the big wind. Max gave her the ball, and Lily "
            "gave him a basket of apples. Together they counted the apples: one, two, three, four, five, six, "
            "seven. There were seven apples in all. They ate them by the river and watched the stars come out, "
            'one by one. "Thank you, Max," said Lily. "You are a true friend." And they stayed friends '
            "forever. The end.",
        ],
    ),
    (
        "de",
        "German",
        [
            "Es war einmal ein freundlicher Fuchs namens Max. Er wohnte in einem kleinen Haus am Fluss. Jeden "
            "Tag sang Max gern Lieder am Wasser. Am Montag regnete es den ganzen Morgen, also blieb Max drinnen "
            "und trank warme Milch. Am Nachmittag kam die Sonne heraus, und Max ging am Fluss spazieren. Unter "
            "einem alten Baum fand er einen roten Ball. „Was für ein schöner Ball!“, sagte Max. Er wusste "
            "nicht, wem der Ball gehörte, also fragte er die Vögel, die Frösche und die Fische. Niemand wusste "
            "es.",
            "Am Dienstag brachte Max den Ball zu seiner Freundin Lily, dem Kaninchen. Lily lachte und sagte, es "
            "sei ihr Ball: Sie hatte ihn vor einer Woche verloren, am Tag des großen Windes. Max gab ihr den "
            "Ball, und Lily schenkte ihm einen Korb voller Äpfel. Zusammen zählten sie die Äpfel: eins, zwei, "
            "drei, vier, fünf, sechs, sieben. Es waren insgesamt sieben Äpfel. Sie aßen sie am Fluss und sahen "
            "zu, wie die Sterne einer nach dem anderen aufgingen. „Danke, Max“, sagte Lily. „Du bist ein "
            "wahrer Freund.“ Und sie blieben für immer Freunde. Ende.",
        ],
    ),
    (
        "fr",
        "French",
        [
            "Il était une fois un gentil renard qui s'appelait Max. Il habitait dans une petite maison près de "
            "la rivière. Chaque jour, Max aimait chanter au bord de l'eau. Lundi, il a plu toute la matinée, "
            "alors Max est resté à la maison et a bu du lait chaud. L'après-midi, le soleil est revenu, et Max "
            "est allé se promener le long de la rivière. Sous un vieil arbre, il a trouvé une balle rouge. "
            "« Quelle jolie balle ! » a dit Max. Il ne savait pas à qui était la balle, alors il a demandé aux "
            "oiseaux, aux grenouilles et aux poissons. Personne ne le savait.",
            "Mardi, Max a apporté la balle à son amie Lily, la lapine. Lily a ri et a dit que c'était sa "
            "balle : elle l'avait perdue une semaine plus tôt, le jour du grand vent. Max lui a rendu la balle, "
            "et Lily lui a offert un panier de pommes. Ensemble, ils ont compté les pommes : un, deux, trois, "
            "quatre, cinq, six, sept. Il y avait sept pommes en tout. Ils les ont mangées au bord de la rivière "
            "et ont regardé les étoiles apparaître une à une. « Merci, Max, a dit Lily. Tu es un vrai ami. » "
            "Et ils sont restés amis pour toujours. Fin.",
        ],
    ),
    (
        "es",
        "Spanish",
        [
            "Había una vez un zorro amable llamado Max. Vivía en una casita cerca del río. Todos los días, a "
            "Max le gustaba cantar canciones junto al agua. El lunes llovió toda la mañana, así que Max se quedó "
            "en casa y bebió leche caliente. Por la tarde salió el sol, y Max fue a pasear por la orilla del "
            "río. Debajo de un árbol viejo encontró una pelota roja. —¡Qué pelota tan bonita! —dijo Max. No "
            "sabía de quién era la pelota, así que les preguntó a los pájaros, a las ranas y a los peces. Nadie "
            "lo sabía.",
            "El martes, Max llevó la pelota a su amiga Lily, la coneja. Lily se rio y dijo que era su pelota: "
            "la había perdido hacía una semana, el día del gran viento. Max le devolvió la pelota, y Lily le "
            "regaló una cesta de manzanas. Juntos contaron las manzanas: una, dos, tres, cuatro, cinco, seis, "
            "siete. Había siete manzanas en total. Se las comieron junto al río y miraron cómo salían las "
            "estrellas, una a una. —Gracias, Max —dijo Lily—. Eres un verdadero amigo. Y fueron amigos para "
            "siempre. Fin.",
        ],
    ),
    (
        "ru",
        "Russian",
        [
            "Жил-был добрый лис по имени Макс. Он жил в маленьком домике у реки. Каждый день Макс любил петь "
            "песни у воды. В понедельник всё утро шёл дождь, поэтому Макс сидел дома и пил тёплое молоко. После "
            "обеда выглянуло солнце, и Макс пошёл гулять вдоль реки. Под старым деревом он нашёл красный мяч. "
            "«Какой чудесный мяч!» — сказал Макс. Он не знал, чей это мяч, поэтому спросил птиц, лягушек и рыб. "
            "Никто не знал.",
            "Во вторник Макс отнёс мяч своей подруге, крольчихе Лили. Лили засмеялась и сказала, что это её "
            "мяч: она потеряла его неделю назад, в день сильного ветра. Макс отдал ей мяч, а Лили подарила ему "
            "корзину яблок. Вместе они посчитали яблоки: одно, два, три, четыре, пять, шесть, семь. Всего было "
            "семь яблок. Они съели их у реки и смотрели, как одна за другой зажигаются звёзды. «Спасибо, Макс, "
            "— сказала Лили. — Ты настоящий друг». И они остались друзьями навсегда. Конец.",
        ],
    ),
    (
        "el",
        "Greek",
        [
            "Μια φορά κι έναν καιρό ζούσε ένα καλό αλεπουδάκι που το έλεγαν Μαξ. Έμενε σε ένα μικρό σπίτι "
            "κοντά στο ποτάμι. Κάθε μέρα, ο Μαξ αγαπούσε να τραγουδάει δίπλα στο νερό. Τη Δευτέρα έβρεχε όλο "
            "το πρωί, γι' αυτό ο Μαξ έμεινε μέσα και ήπιε ζεστό γάλα. Το απόγευμα βγήκε ο ήλιος, και ο Μαξ πήγε "
            "βόλτα δίπλα στο ποτάμι. Κάτω από ένα γέρικο δέντρο βρήκε μια κόκκινη μπάλα. «Τι ωραία μπάλα!» "
            "είπε ο Μαξ. Δεν ήξερε τίνος ήταν η μπάλα, γι' αυτό ρώτησε τα πουλιά, τους βατράχους και τα ψάρια. "
            "Κανείς δεν ήξερε.",
            "Την Τρίτη, ο Μαξ πήγε την μπάλα στη φίλη του τη Λίλι, το κουνελάκι. Η Λίλι γέλασε και είπε ότι "
            "ήταν δική της μπάλα: την είχε χάσει πριν από μια εβδομάδα, τη μέρα του μεγάλου αέρα. Ο Μαξ της "
            "έδωσε την μπάλα, και η Λίλι του χάρισε ένα καλάθι μήλα. Μαζί μέτρησαν τα μήλα: ένα, δύο, τρία, "
            "τέσσερα, πέντε, έξι, επτά. Ήταν επτά μήλα συνολικά. Τα έφαγαν δίπλα στο ποτάμι και κοίταζαν τα "
            "αστέρια να βγαίνουν ένα ένα. «Ευχαριστώ, Μαξ», είπε η Λίλι. «Είσαι αληθινός φίλος.» Και έμειναν "
            "φίλοι για πάντα. Τέλος.",
        ],
    ),
    (
        "ar",
        "Arabic",
        [
            "كان يا ما كان، ثعلب طيب اسمه ماكس. كان يعيش في بيت صغير قرب النهر. وكان ماكس يحب كل يوم أن يغني "
            "الأغاني بجانب الماء. يوم الاثنين، أمطرت السماء طوال الصباح، فبقي ماكس في البيت وشرب حليبًا دافئًا. "
            "وفي العصر طلعت الشمس، فخرج ماكس يتمشى على ضفة النهر. وتحت شجرة قديمة وجد كرة حمراء. قال ماكس: "
            "«يا لها من كرة جميلة!» لم يكن يعرف لمن الكرة، فسأل الطيور والضفادع والأسماك. لكن لم يعرف أحد.",
            "يوم الثلاثاء، أخذ ماكس الكرة إلى صديقته الأرنبة ليلي. ضحكت ليلي وقالت إنها كرتها: فقد أضاعتها قبل "
            "أسبوع، في يوم الريح الشديدة. أعطاها ماكس الكرة، فأهدته ليلي سلة من التفاح. وعدّا التفاح معًا: "
            "واحد، اثنان، ثلاثة، أربعة، خمسة، ستة، سبعة. كانت سبع تفاحات في المجموع. أكلاها بجانب النهر "
            "وشاهدا النجوم تظهر واحدة تلو الأخرى. قالت ليلي: «شكرًا يا ماكس، أنت صديق حقيقي.» وبقيا صديقين "
            "إلى الأبد. النهاية.",
        ],
    ),
    (
        "hi",
        "Hindi",
        [
            "एक समय की बात है, मैक्स नाम का एक दयालु लोमड़ था। वह नदी के पास एक छोटे से घर में रहता था। "
            "मैक्स को हर दिन पानी के किनारे गाने गाना पसंद था। सोमवार को पूरी सुबह बारिश होती रही, इसलिए "
            "मैक्स घर पर ही रहा और उसने गरम दूध पिया। दोपहर को धूप निकली, और मैक्स नदी के किनारे-किनारे "
            'टहलने गया। एक पुराने पेड़ के नीचे उसे एक लाल गेंद मिली। "कितनी सुंदर गेंद है!" मैक्स ने कहा। '
            "उसे नहीं पता था कि गेंद किसकी है, इसलिए उसने चिड़ियों, मेंढकों और मछलियों से पूछा। किसी को "
            "नहीं पता था।",
            "मंगलवार को मैक्स वह गेंद अपनी सहेली लिली खरगोश के पास ले गया। लिली हँसी और बोली कि यह उसकी "
            "गेंद है: एक हफ़्ते पहले, तेज़ हवा वाले दिन, वह खो गई थी। मैक्स ने उसे गेंद लौटा दी, और लिली ने "
            "उसे सेबों की एक टोकरी दी। दोनों ने मिलकर सेब गिने: एक, दो, तीन, चार, पाँच, छह, सात। कुल सात "
            'सेब थे। उन्होंने नदी के किनारे बैठकर सेब खाए और एक-एक करके तारों को निकलते देखा। "धन्यवाद, '
            'मैक्स," लिली ने कहा। "तुम सच्चे दोस्त हो।" और वे हमेशा के लिए दोस्त बने रहे। समाप्त।',
        ],
    ),
    (
        "zh",
        "Chinese",
        [
            "从前，有一只善良的狐狸，名叫马克斯。他住在河边的一座小房子里。马克斯每天都喜欢在水边唱歌。"
            "星期一下了一上午的雨，所以马克斯待在家里，喝了一杯热牛奶。下午，太阳出来了，马克斯沿着河边去散步。"
            "在一棵老树下，他发现了一个红色的球。“多可爱的球啊！”马克斯说。他不知道这个球是谁的，"
            "于是去问小鸟、青蛙和鱼儿。可是谁也不知道。",
            "星期二，马克斯把球带给了他的朋友——小兔子莉莉。莉莉笑了，说这是她的球：一个星期前刮大风的那天，"
            "她把球弄丢了。马克斯把球还给了她，莉莉送给他一篮苹果。他们一起数苹果：一、二、三、四、五、六、七。"
            "一共有七个苹果。他们在河边吃了苹果，看着星星一颗一颗地亮起来。“谢谢你，马克斯，”莉莉说，"
            "“你是真正的朋友。”从此，他们永远是好朋友。完。",
        ],
    ),
    (
        "ja",
        "Japanese",
        [
            "むかしむかし、マックスという名前のやさしいキツネがいました。マックスは川のそばの小さな家に"
            "住んでいました。毎日、水辺で歌を歌うのが大好きでした。月曜日は朝からずっと雨がふっていたので、"
            "マックスは家にいて、あたたかいミルクを飲みました。午後になると太陽が出てきたので、マックスは"
            "川ぞいを散歩しました。古い木の下で、赤いボールを見つけました。「なんてすてきなボールだろう！」と"
            "マックスは言いました。だれのボールかわからなかったので、鳥やカエルや魚にたずねました。でも、"
            "だれも知りませんでした。",
            "火曜日、マックスはボールを友だちのウサギのリリーのところへ持っていきました。リリーは笑って、"
            "それは自分のボールだと言いました。一週間前、大風の日になくしてしまったのです。マックスがボールを"
            "返すと、リリーはお礼にリンゴをひとかごくれました。ふたりはいっしょにリンゴを数えました。いち、に、"
            "さん、し、ご、ろく、なな。ぜんぶで七つのリンゴがありました。ふたりは川のそばでリンゴを食べ、"
            "星がひとつずつ出てくるのをながめました。「ありがとう、マックス。あなたは本当の友だちよ」と"
            "リリーは言いました。そして、ふたりはいつまでも友だちでした。おしまい。",
        ],
    ),
    (
        "ko",
        "Korean",
        [
            "옛날 옛적에 맥스라는 착한 여우가 살았어요. 맥스는 강가의 작은 집에서 살았어요. 맥스는 날마다 "
            "물가에서 노래 부르는 것을 좋아했어요. 월요일에는 아침 내내 비가 와서 맥스는 집에 머물며 따뜻한 "
            "우유를 마셨어요. 오후가 되자 해가 나와서 맥스는 강을 따라 산책을 나갔어요. 오래된 나무 아래에서 "
            '맥스는 빨간 공을 발견했어요. "정말 예쁜 공이네!" 맥스가 말했어요. 누구의 공인지 몰라서 맥스는 '
            "새들과 개구리들과 물고기들에게 물어보았어요. 하지만 아무도 몰랐어요.",
            "화요일에 맥스는 그 공을 친구인 토끼 릴리에게 가져갔어요. 릴리는 웃으면서 그것이 자기 공이라고 "
            "말했어요. 일주일 전, 바람이 세게 불던 날에 잃어버렸던 거예요. 맥스가 공을 돌려주자 릴리는 사과 "
            "한 바구니를 선물했어요. 둘은 함께 사과를 세었어요. 하나, 둘, 셋, 넷, 다섯, 여섯, 일곱. 사과는 "
            "모두 일곱 개였어요. 둘은 강가에서 사과를 먹으며 별이 하나둘 떠오르는 것을 바라보았어요. "
            '"고마워, 맥스. 너는 진정한 친구야." 릴리가 말했어요. 그리고 둘은 영원히 친구로 지냈어요. 끝.',
        ],
    ),
    (
        "python",
        "Python",
        [
            '"""Count the words of a story, and find the ones it uses most."""\n'
            "\n"
            "from collections import Counter\n"
            "\n"
            "\n"
            "def word_counts(text: str, top: int = 5) -> list[tuple[str, int]]:\n"
            '    """The `top` most common words of `text`, lower-cased, with how often each occurs."""\n'
            '    words = [w.strip(".,!?\\"\'").lower() for w in text.split()]\n'
            "    return Counter(w for w in words if w).most_common(top)\n"
            "\n"
            "\n"
            "class Story:\n"
            '    """A short story: its hero, what the hero found, and the day it happened."""\n'
            "\n"
            "    def __init__(self, hero: str, found: str, day: str) -> None:\n"
            "        self.hero, self.found, self.day = hero, found, day\n"
            "\n"
            "    def first_line(self) -> str:\n"
            '        return f"On {self.day}, {self.hero} found {self.found}."\n'
            "\n"
            "\n"
            'if __name__ == "__main__":\n'
            '    story = Story("Max", "a red ball", "Monday")\n'
            "    print(story.first_line())\n"
            "    for word, n in word_counts(story.first_line() * 3):\n"
            '        print(f"{word:>8} {n:3d}")\n',
            "def count_apples(baskets: dict[str, int], friends: list[str]) -> dict[str, int]:\n"
            '    """Share the apples of every basket among `friends`, as evenly as whole apples allow.\n'
            "\n"
            '    >>> count_apples({"Lily": 7}, ["Max", "Lily"])\n'
            "    {'Max': 4, 'Lily': 3}\n"
            '    """\n'
            "    total = sum(baskets.values())\n"
            "    if not friends:\n"
            '        raise ValueError("nobody to share the apples with")\n'
            "    share, left = divmod(total, len(friends))\n"
            "    result = {}\n"
            "    for i, name in enumerate(friends):\n"
            "        result[name] = share + (1 if i < left else 0)  # the first ones get the apples left over\n"
            "    return result\n",
        ],
    ),
]


def lines() -> list[str]:
    """The JSONL lines, one per paragraph, in STORIES' order."""
    return [
        json.dumps({"lang": lang, "name": name, "text": text}, ensure_ascii=False)
        for lang, name, paragraphs in STORIES
        for text in paragraphs
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(Path(__file__).with_name("languages.jsonl")), help="- for stdout")
    args = parser.parse_args()
    data = "".join(line + "\n" for line in lines())
    if args.output == "-":
        sys.stdout.write(data)
    else:
        Path(args.output).write_text(data, encoding="utf-8")


if __name__ == "__main__":
    main()
