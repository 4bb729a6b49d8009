"""The baked Python stack's round trips (PKG-1): each document format is written by one library
and read back by another, and the numeric libraries are checked against known values. Run by
scripts/build-python-stack, in the jail when a `corral` binary is given. It writes only under a
fresh directory in the temporary directory (/tmp in the jail), needs no network, and ends with
`stack round trips: ok (N checks)`; any failure raises.
"""

import datetime
import math
import os
import shutil
import sys
import tempfile

WORK = tempfile.mkdtemp(prefix="corral-roundtrip-")
os.environ.setdefault("MPLCONFIGDIR", os.path.join(WORK, "matplotlib"))

CHECKS = []
ROWS = [("name", "count", "price"), ("apple", 3, 1.25), ("pear", 5, 0.5), ("plum", 7, 2.0)]
PDF_TEXT = "Corral round trip 4711"
PNG_SIZE = (400, 300)


def check(function):
    CHECKS.append(function)
    return function


def path(name):
    return os.path.join(WORK, name)


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def close_to(actual, expected, tolerance, what):
    expect(abs(actual - expected) <= tolerance, f"{what}: {actual!r}, expected {expected!r}")


def read_xlsx_rows(file):
    import openpyxl

    book = openpyxl.load_workbook(file)
    return [tuple(row) for row in book.active.iter_rows(values_only=True)]


@check
def interpreter_is_the_stack():
    expect(sys.prefix != sys.base_prefix, f"{sys.executable} is not the baked stack's venv")
    stack_id = os.path.join(sys.prefix, "corral-stack.id")
    expect(os.path.isfile(stack_id), f"{sys.prefix} is not a baked stack (no corral-stack.id)")
    system = [p for p in sys.path if "dist-packages" in p]
    expect(not system, f"the system's packages are on sys.path: {system}")


@check
def openpyxl_writes_openpyxl_reads():
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "fruit"
    for row in ROWS:
        sheet.append(row)
    sheet["E1"] = datetime.date(2024, 2, 29)
    sheet["E2"] = "=SUM(B2:B4)"
    book.save(path("openpyxl.xlsx"))
    rows = read_xlsx_rows(path("openpyxl.xlsx"))
    expect([r[:3] for r in rows] == ROWS, f"openpyxl read back {rows!r}")
    expect(rows[0][4] == datetime.datetime(2024, 2, 29), f"date read back as {rows[0][4]!r}")
    expect(rows[1][4] == "=SUM(B2:B4)", f"formula read back as {rows[1][4]!r}")


@check
def xlsxwriter_writes_openpyxl_and_pandas_read():
    import pandas
    import xlsxwriter

    book = xlsxwriter.Workbook(path("xlsxwriter.xlsx"))
    sheet = book.add_worksheet("fruit")
    bold = book.add_format({"bold": True})
    for r, row in enumerate(ROWS):
        sheet.write_row(r, 0, row, bold if r == 0 else None)
    book.close()
    rows = read_xlsx_rows(path("xlsxwriter.xlsx"))
    expect(rows == ROWS, f"openpyxl read back {rows!r}")
    frame = pandas.read_excel(path("xlsxwriter.xlsx"), sheet_name="fruit")
    expect(list(frame.columns) == list(ROWS[0]), f"pandas columns {list(frame.columns)!r}")
    expect(frame["count"].sum() == 15, f"pandas count sum {frame['count'].sum()!r}")
    close_to(float(frame["price"].sum()), 3.75, 1e-12, "pandas price sum")


@check
def pandas_writes_with_both_engines():
    import pandas

    frame = pandas.DataFrame(ROWS[1:], columns=ROWS[0])
    for engine in ("openpyxl", "xlsxwriter"):
        file = path(f"pandas-{engine}.xlsx")
        frame.to_excel(file, index=False, engine=engine)
        back = pandas.read_excel(file)
        expect(back.equals(frame), f"pandas through {engine} read back\n{back}")


@check
def matplotlib_png():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy
    from PIL import Image

    x = numpy.linspace(0, 2 * math.pi, 200)
    figure, axes = plt.subplots(figsize=(PNG_SIZE[0] / 100, PNG_SIZE[1] / 100), dpi=100)
    axes.plot(x, numpy.sin(x), label="sin")
    axes.set_title("round trip")
    axes.legend()
    figure.savefig(path("plot.png"), dpi=100)
    plt.close(figure)
    with open(path("plot.png"), "rb") as file:
        expect(file.read(8) == b"\x89PNG\r\n\x1a\n", "the figure is not a PNG")
    with Image.open(path("plot.png")) as image:
        expect(image.format == "PNG", f"Pillow reads {image.format}")
        expect(image.size == PNG_SIZE, f"PNG size {image.size}, expected {PNG_SIZE}")
        expect(len(image.getcolors(maxcolors=1 << 16) or [0] * 3) > 2, "the PNG is blank")


@check
def pillow_formats():
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 32), "white")
    ImageDraw.Draw(image).rectangle((8, 8, 24, 24), fill=(200, 10, 10))
    for name in ("pillow.jpg", "pillow.png", "pillow.webp", "pillow.tiff"):
        image.save(path(name))
        with Image.open(path(name)) as back:
            expect(back.size == (64, 32), f"{name} read back at {back.size}")
            red = back.convert("RGB").getpixel((16, 16))
            expect(red[0] > 150 and red[1] < 60, f"{name} pixel read back as {red}")


@check
def word_document():
    import docx

    document = docx.Document()
    document.add_heading("Round trip", level=1)
    document.add_paragraph("Plain text, " + "with a bold run.")
    table = document.add_table(rows=len(ROWS), cols=len(ROWS[0]))
    for r, row in enumerate(ROWS):
        for c, value in enumerate(row):
            table.cell(r, c).text = str(value)
    document.save(path("document.docx"))
    back = docx.Document(path("document.docx"))
    texts = [p.text for p in back.paragraphs]
    expect(texts[:2] == ["Round trip", "Plain text, with a bold run."], f"paragraphs {texts!r}")
    expect(back.tables[0].cell(2, 0).text == "pear", "the table did not read back")


@check
def powerpoint_presentation():
    import pptx
    from pptx.util import Inches

    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "Round trip"
    slide.placeholders[1].text = "First point"
    if not os.path.exists(path("plot.png")):
        matplotlib_png()
    slide.shapes.add_picture(path("plot.png"), Inches(1), Inches(3), width=Inches(4))
    presentation.save(path("slides.pptx"))
    back = pptx.Presentation(path("slides.pptx"))
    expect(len(back.slides) == 1, f"{len(back.slides)} slides read back")
    shapes = back.slides[0].shapes
    expect(shapes.title.text == "Round trip", f"title {shapes.title.text!r}")
    texts = [s.text_frame.text for s in shapes if s.has_text_frame]
    expect("First point" in texts, f"texts {texts!r}")
    pictures = [s for s in shapes if s.shape_type == pptx.enum.shapes.MSO_SHAPE_TYPE.PICTURE]
    expect(len(pictures) == 1 and pictures[0].image.content_type == "image/png", "no PNG picture")


@check
def reportlab_pdf_read_by_pypdf():
    import pypdf
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.pdfgen import canvas
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Table

    pdf = canvas.Canvas(path("canvas.pdf"), pagesize=A4)
    pdf.drawString(72, 720, PDF_TEXT)
    pdf.showPage()
    pdf.drawString(72, 720, "second page")
    pdf.save()
    reader = pypdf.PdfReader(path("canvas.pdf"))
    expect(len(reader.pages) == 2, f"{len(reader.pages)} pages read back")
    text = reader.pages[0].extract_text()
    expect(PDF_TEXT in text, f"page 1 text {text!r}")

    styles = getSampleStyleSheet()
    story = [Paragraph("Fruit report", styles["Title"]), Table([list(map(str, r)) for r in ROWS])]
    SimpleDocTemplate(path("platypus.pdf"), pagesize=A4).build(story)
    text = pypdf.PdfReader(path("platypus.pdf")).pages[0].extract_text()
    expect("Fruit report" in text and "plum" in text, f"platypus text {text!r}")


@check
def scipy_known_values():
    import numpy
    from scipy import integrate, linalg, optimize, stats

    value, error = integrate.quad(lambda x: math.exp(-x * x), -math.inf, math.inf)
    close_to(value, math.sqrt(math.pi), 1e-9, "integral of exp(-x^2) over R")
    close_to(stats.norm.cdf(1.96), 0.9750021048517795, 1e-9, "norm.cdf(1.96)")
    root = optimize.brentq(lambda x: math.cos(x) - x, 0, 1)
    close_to(root, 0.7390851332151607, 1e-9, "root of cos(x) = x")
    a = numpy.array([[3.0, 2.0, -1.0], [2.0, -2.0, 4.0], [-1.0, 0.5, -1.0]])
    b = numpy.array([1.0, -2.0, 0.0])
    solution = linalg.solve(a, b)
    expect(numpy.allclose(solution, [1.0, -2.0, -2.0]), f"linalg.solve gave {solution}")
    close_to(float(numpy.fft.fft(numpy.ones(8))[0].real), 8.0, 1e-12, "numpy fft")


@check
def pandas_frame_operations():
    import numpy
    import pandas

    frame = pandas.DataFrame(
        {"day": pandas.date_range("2024-01-01", periods=6, freq="D"),
         "kind": ["a", "b"] * 3, "value": numpy.arange(6, dtype=float)})
    grouped = frame.groupby("kind")["value"].sum()
    expect(grouped.to_dict() == {"a": 6.0, "b": 9.0}, f"groupby gave {grouped.to_dict()}")
    frame.to_csv(path("frame.csv"), index=False)
    back = pandas.read_csv(path("frame.csv"), parse_dates=["day"])
    expect(back["day"].iloc[-1] == pandas.Timestamp("2024-01-06"), "csv dates did not read back")
    local = pandas.Timestamp("2024-07-01 12:00", tz="Europe/Berlin")
    expect(local.utcoffset() == datetime.timedelta(hours=2), f"time zone offset {local.utcoffset()}")


@check
def html_and_xml_parsers():
    import bs4
    import lxml.etree
    import lxml.html

    html = "<html><body><h1 id='t'>Title</h1><ul><li>one</li><li class='x'>two</li></ul></body></html>"
    for parser in ("lxml", "html.parser"):
        soup = bs4.BeautifulSoup(html, parser)
        expect(soup.find(id="t").get_text() == "Title", f"bs4 with {parser}")
        expect([li.text for li in soup.select("li.x")] == ["two"], f"bs4 CSS select with {parser}")
    root = lxml.etree.fromstring(b"<a><b n='1'>x</b><b n='2'>y</b></a>")
    expect(root.xpath("//b[@n='2']/text()") == ["y"], "lxml xpath")
    expect(lxml.html.fromstring(html).xpath("//li/text()") == ["one", "two"], "lxml.html")


@check
def requests_offline():
    import certifi
    import requests

    prepared = requests.Request(
        "POST", "http://example.invalid/path", params={"q": "a b"}, json={"k": [1, 2]}
    ).prepare()
    expect(prepared.url == "http://example.invalid/path?q=a+b", f"prepared URL {prepared.url}")
    expect(prepared.body == b'{"k": [1, 2]}', f"prepared body {prepared.body!r}")
    expect(os.path.getsize(certifi.where()) > 1000, "certifi's bundle is missing")
    session = requests.Session()
    expect(session.get_adapter("https://example.invalid/") is not None, "no HTTPS adapter")


@check
def yaml_tabulate_cloudpickle():
    import pickle

    import cloudpickle
    import tabulate
    import yaml

    data = {"name": "corral", "values": [1, 2.5, None], "nested": {"ok": True}}
    expect(yaml.safe_load(yaml.safe_dump(data)) == data, "YAML round trip")
    expect(yaml.__with_libyaml__, "PyYAML lacks its libyaml loader")
    expect(yaml.load(yaml.dump(data), Loader=yaml.CSafeLoader) == data, "YAML through libyaml")
    table = tabulate.tabulate([["a", 1], ["b", 22]], headers=["k", "v"], tablefmt="github")
    expected = "| k   |   v |\n|-----|-----|\n| a   |   1 |\n| b   |  22 |"
    expect(table == expected, f"tabulate gave\n{table}")
    offset = 41
    function = pickle.loads(cloudpickle.dumps(lambda x: x + offset))
    expect(function(1) == 42, "cloudpickle round trip of a closure")


def main():
    try:
        for function in CHECKS:
            try:
                function()
            except Exception:
                print(f"stack round trip {function.__name__} failed:", file=sys.stderr)
                raise
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    print(f"stack round trips: ok ({len(CHECKS)} checks)")


if __name__ == "__main__":
    main()
